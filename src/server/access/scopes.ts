/**
 * Scopes: what a caller may call. Three access levels, each implying the
 * ones below it (`admin` ⊃ `mutating` ⊃ `public`), grant every method
 * declared at that level or below; a service scope (`images`) and a method
 * scope (`images.generate`) grant that service's or that method's calls
 * whatever their level. The full names work too: `mmgate.images.v1.ImageService`
 * and `mmgate.images.v1.ImageService/Generate`. Scopes are matched without
 * regard to case.
 */
import type { DescMethod } from "@bufbuild/protobuf";
import { getOption } from "@bufbuild/protobuf";
import { Access, access } from "../../../gen/mmgate/options/v1/options_pb.js";
// suggest.ts itself, not config/index.js: the config schema imports this folder's schemas.
import { nearestName } from "../config/suggest.js";

export { Access };

/** The access level a method declares with `(mmgate.options.v1.access)`; PUBLIC when absent. */
export function methodAccess(method: DescMethod): Access {
  const level = getOption(method, access);
  return level === Access.UNSPECIFIED ? Access.PUBLIC : level;
}

const accessCache = new WeakMap<DescMethod, Access>();

/** methodAccess, read once per method: it runs on every call that auth checks. */
export function cachedMethodAccess(method: DescMethod): Access {
  let level = accessCache.get(method);
  if (level === undefined) {
    level = methodAccess(method);
    accessCache.set(method, level);
  }
  return level;
}

/** The access levels as scopes, lowest first: each implies the ones before it. */
export const ACCESS_SCOPES = ["public", "mutating", "admin"] as const;
export type AccessScope = (typeof ACCESS_SCOPES)[number];

/** The scope of an access level. */
export function accessScope(level: Access): AccessScope {
  return level === Access.ADMIN ? "admin" : level === Access.MUTATING ? "mutating" : "public";
}

/**
 * The short name of every service of proto/, which its service and method
 * scopes start with. One rule chose them: the package's own name, the
 * segment before its version (`mmgate.images.v1` → `images`); where that
 * name would be shared by different services (several services in one
 * package, or two packages of the same name), each of them takes its own
 * name in kebab case without the `Service` suffix instead
 * (`mmgate.encode.v1.EncodeHopService` → `encode-hop`). Versions of one
 * service share its name (`reflection`). `admin` is also the access level,
 * which grants every method of AdminService anyway.
 *
 * The table, not the rule, is what a keys file is read against: a service
 * added later must not rename an existing scope. test/server/auth-keys.test.ts
 * holds it to every service of proto/ and to the rule.
 */
export const SERVICE_SCOPES: ReadonlyMap<string, string> = new Map([
  ["grpc.health.v1.Health", "health"],
  ["grpc.reflection.v1.ServerReflection", "reflection"],
  ["grpc.reflection.v1alpha.ServerReflection", "reflection"],
  ["mmgate.admin.v1.AdminService", "admin"],
  ["mmgate.images.v1.ImageService", "images"],
  ["mmgate.media.v1.MediaService", "media"],
  ["mmgate.kvevents.v1.KvEventService", "kvevents"],
  ["mmgate.kvrouter.v1.OverlapService", "kvrouter"],
  ["mmgate.llm.v1.TokenWorkerService", "llm"],
  ["mmgate.encode.v1.EncodeWorkerService", "encode-worker"],
  ["mmgate.encode.v1.EncodeHopService", "encode-hop"],
  ["mmgate.kvrelay.v1.Cbi1Service", "cbi1"],
  ["mmgate.kvrelay.v1.DecodedRelayService", "decoded-relay"],
  ["dynamo.kvrelay.v1.KvEventRelay", "kv-event-relay"],
]);

/** A service's name in kebab case without the `Service` suffix: `EncodeHopService` → `encode-hop`. */
export function kebabServiceName(typeName: string): string {
  const name = typeName.slice(typeName.lastIndexOf(".") + 1).replace(/(.)Service$/, "$1");
  return name.replace(/([a-z0-9])([A-Z])/g, "$1-$2").replace(/([A-Z]+)([A-Z][a-z])/g, "$1-$2").toLowerCase();
}

/** The scope of a service: its entry in SERVICE_SCOPES, else (a service outside proto/) its kebab-case name. */
export function serviceScope(typeName: string): string {
  return SERVICE_SCOPES.get(typeName) ?? kebabServiceName(typeName);
}

/** The scope of one method: its service's, a dot, the method's name with a lower-case first letter (`images.generateStream`). */
export function methodScope(typeName: string, methodName: string): string {
  return `${serviceScope(typeName)}.${methodName.charAt(0).toLowerCase()}${methodName.slice(1)}`;
}

/**
 * What a scope may look like: a level, a short service or method name, or
 * a full service name with an optional `/Method`. Whether it names
 * anything is the catalog's question.
 */
export const SCOPE_SYNTAX = /^[A-Za-z][\w-]*(?:\.[A-Za-z][\w-]*)*(?:\/[A-Za-z]\w*)?$/;
export const SCOPE_MAX_LENGTH = 200;

const grantingCache = new WeakMap<DescMethod, readonly string[]>();

/**
 * Every scope, lower-cased, that grants a call of `method`: the access
 * levels at or above its own, its service's scopes and its own, short and
 * full. A PUBLIC method is open to anyone and needs none of them.
 */
export function grantingScopes(method: DescMethod): readonly string[] {
  let scopes = grantingCache.get(method);
  if (scopes === undefined) {
    const typeName = method.parent.typeName;
    const level = cachedMethodAccess(method);
    scopes = [
      ...ACCESS_SCOPES.slice(ACCESS_SCOPES.indexOf(accessScope(level))),
      serviceScope(typeName),
      methodScope(typeName, method.name),
      typeName,
      `${typeName}/${method.name}`,
    ].map((s) => s.toLowerCase());
    grantingCache.set(method, scopes);
  }
  return scopes;
}

/** A set of scopes as written, with the levels each one implies, and its lower-cased form for matching. */
export function expandScopes(written: readonly string[]): { scopes: ReadonlySet<string>; match: ReadonlySet<string> } {
  const scopes = new Set<string>();
  for (const scope of written) {
    const level = ACCESS_SCOPES.indexOf(scope.toLowerCase() as AccessScope);
    if (level >= 0) for (const implied of ACCESS_SCOPES.slice(0, level + 1)) scopes.add(implied);
    else scopes.add(scope);
  }
  return { scopes, match: new Set([...scopes].map((s) => s.toLowerCase())) };
}

/** A service as far as scopes go: its full name and its methods' names. */
export interface ServiceNames {
  readonly typeName: string;
  readonly methods: readonly string[];
}

/**
 * The scopes that name something: the levels and every scope of the
 * services given (all of proto/, read from the descriptor image, plus the
 * ones this process serves). A scope outside it grants nothing; the server
 * says so in a warning, `mmgate keys add` refuses it.
 */
export class ScopeCatalog {
  private readonly known = new Map<string, string>();

  constructor(services: Iterable<ServiceNames>) {
    const add = (scope: string) => this.known.set(scope.toLowerCase(), scope);
    for (const level of ACCESS_SCOPES) add(level);
    for (const service of services) {
      add(serviceScope(service.typeName));
      add(service.typeName);
      for (const method of service.methods) {
        add(methodScope(service.typeName, method));
        add(`${service.typeName}/${method}`);
      }
    }
  }

  /** How many services' scopes it knows beyond the levels (0: nothing to check against). */
  get size(): number {
    return this.known.size - ACCESS_SCOPES.length;
  }

  has(scope: string): boolean {
    return this.known.has(scope.toLowerCase());
  }

  /** The known scope nearest to a mistyped one, when one is near. */
  suggest(scope: string): string | undefined {
    return nearestName(scope, this.known.values());
  }

  /** `scope` as the problem it is when it names nothing known: with the nearest known scope, when there is one. */
  describeUnknown(scope: string): string {
    const near = this.suggest(scope);
    return `scope ${scope} names no access level, service or method${near === undefined ? "" : `; did you mean ${near}?`}`;
  }
}
