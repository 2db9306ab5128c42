/**
 * The relay's identity messages between the wire and mmgate's types, with
 * the contract's validation (C.2). Every refusal is a RelayError: malformed
 * input is INVALID_REQUEST; input this build cannot interpret (an unknown
 * enum value, identity version or model-target kind, a CKF format other than
 * (1, 16, 4) or past 2^24 buckets) is UNSUPPORTED_FEATURE, which a consumer
 * answers by quarantining that pool only.
 */
import { create } from "@bufbuild/protobuf";
import {
  CkfFormatSchema,
  DigestIdentitySchema,
  DynamoEndpointIdSchema,
  IdentitySource as WireIdentitySource,
  IndexerDomainIdSchema,
  KvPoolDescriptorSchema,
  KvPoolIdSchema,
  KvQueryHashFormat as WireHashFormat,
  KvQuerySemanticsSchema,
  ModelRegistrationSchema,
  ModelTargetSchema,
  ProducerIdentitySchema,
  WorkerRole as WireWorkerRole,
  type DigestIdentity as WireDigestIdentity,
  type DynamoEndpointId as WireEndpointId,
  type KvPoolDescriptor as WireKvPoolDescriptor,
  type KvPoolId as WireKvPoolId,
  type KvQuerySemantics as WireKvQuerySemantics,
  type ModelRegistration as WireModelRegistration,
  type ProducerIdentity as WireProducerIdentity,
} from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import {
  canonicalModelId,
  createKvQuerySemantics,
  createRegistrationWithTarget,
  FINGERPRINT_BITS,
  FORMAT_VERSION,
  formatIdentity,
  MAX_RELAY_BUCKET_COUNT,
  modelAlias,
  poolId,
  producerIdentity,
  SLOTS_PER_BUCKET,
  type CanonicalModelRegistration,
  type DigestIdentity,
  type IdentitySource,
  type KvQuerySemantics,
  type ModelTarget,
  type PoolId,
  type ProducerIdentity,
} from "../../kv/index.js";
import { DIGEST_BYTES, MAX_SUBSCRIBER_ID_BYTES, POOL_IDENTITY_VERSION, RELAY_CONTRACT_MARKER } from "./constants.js";
import { RelayError } from "./errors.js";

const malformed = (message: string): RelayError => new RelayError("INVALID_REQUEST", message);
const unsupported = (message: string): RelayError => new RelayError("UNSUPPORTED_FEATURE", message);

/** A request's marker must be the contract's: anything else is CONTRACT_MISMATCH. */
export function checkContractMarker(marker: number): void {
  if (marker !== RELAY_CONTRACT_MARKER) {
    throw new RelayError("CONTRACT_MISMATCH", `unsupported Relay v1 wire contract (contract_marker 0x${(marker >>> 0).toString(16).padStart(8, "0")})`);
  }
}

// Rust's char::is_control: the Cc category, U+0000..U+001F and U+007F..U+009F.
// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/u;

/** A subscriber id: non-empty, at most 128 UTF-8 bytes, no control characters; never truncated. */
export function checkSubscriberId(id: string): string {
  if (id.length === 0) throw malformed("subscriber_id must not be empty");
  const bytes = Buffer.byteLength(id, "utf8");
  if (bytes > MAX_SUBSCRIBER_ID_BYTES) throw malformed(`subscriber_id is ${bytes} bytes; at most ${MAX_SUBSCRIBER_ID_BYTES}`);
  if (CONTROL.test(id)) throw malformed("subscriber_id must not contain control characters");
  return id;
}

const SURROUNDING_WHITESPACE = /^\p{White_Space}|\p{White_Space}$/u;

/** A text field of an identity: non-empty, no surrounding whitespace. */
function text(value: string, what: string): string {
  if (value === "") throw malformed(`${what} must not be empty`);
  if (SURROUNDING_WHITESPACE.test(value)) throw malformed(`${what} ${JSON.stringify(value)} must not start or end with whitespace`);
  return value;
}

// --- digests, pool id, producer ---------------------------------------------

function sourceFromWire(source: WireIdentitySource, what: string): IdentitySource {
  switch (source) {
    case WireIdentitySource.DEFAULT_DERIVED:
      return "DefaultDerived";
    case WireIdentitySource.EXPLICIT:
      return "Explicit";
    case WireIdentitySource.UNSPECIFIED:
      throw malformed(`${what}.source must not be UNSPECIFIED`);
    default:
      throw unsupported(`${what}.source ${source as number} is not a known identity source`);
  }
}

function digestFromWire(digest: WireDigestIdentity | undefined, what: string): DigestIdentity {
  if (digest === undefined) throw malformed(`${what} is required`);
  if (digest.digest.length !== DIGEST_BYTES) throw malformed(`${what}.digest is ${digest.digest.length} bytes; exactly ${DIGEST_BYTES}`);
  return { digest: digest.digest, source: sourceFromWire(digest.source, what) };
}

function digestToWire(digest: DigestIdentity): WireDigestIdentity {
  return create(DigestIdentitySchema, {
    digest: digest.digest,
    source: digest.source === "Explicit" ? WireIdentitySource.EXPLICIT : WireIdentitySource.DEFAULT_DERIVED,
  });
}

export function poolIdFromWire(id: WireKvPoolId | undefined, what = "pool_id"): PoolId {
  if (id === undefined) throw malformed(`${what} is required`);
  if (id.identityVersion === 0) throw malformed(`${what}.identity_version must not be 0`);
  if (id.identityVersion !== POOL_IDENTITY_VERSION) throw unsupported(`${what}.identity_version ${id.identityVersion} is not supported`);
  const domain = id.indexerDomain;
  if (domain === undefined) throw malformed(`${what}.indexer_domain is required`);
  return poolId({
    cacheSemantics: digestFromWire(domain.cacheSemantics, `${what}.indexer_domain.cache_semantics`),
    routingScope: digestFromWire(domain.routingScope, `${what}.indexer_domain.routing_scope`),
    dcId: id.dcId,
  });
}

export function poolIdToWire(id: PoolId): WireKvPoolId {
  return create(KvPoolIdSchema, {
    identityVersion: id.identityVersion,
    indexerDomain: create(IndexerDomainIdSchema, {
      cacheSemantics: digestToWire(id.indexerDomain.cacheSemantics),
      routingScope: digestToWire(id.indexerDomain.routingScope),
    }),
    dcId: id.dcId,
  });
}

/**
 * A producer identity from the wire, validated. The format must have no zero
 * field but the seed (malformed), be (1, 16, 4) and at most 2^24 buckets (unsupported),
 * and have a power-of-two bucket count of at least 2 (malformed).
 */
export function producerFromWire(producer: WireProducerIdentity | undefined, what = "producer"): ProducerIdentity {
  if (producer === undefined) throw malformed(`${what} is required`);
  const id = poolIdFromWire(producer.poolId, `${what}.pool_id`);
  const format = producer.ckfFormat;
  if (format === undefined) throw malformed(`${what}.ckf_format is required`);
  const { formatVersion, seed, bucketCount, fingerprintBits, slotsPerBucket } = format;
  // Upstream exempts the seed: 0 is a valid filter seed.
  if (formatVersion === 0 || bucketCount === 0n || fingerprintBits === 0 || slotsPerBucket === 0) {
    throw malformed(`${what}.ckf_format must not have a zero field`);
  }
  if (formatVersion !== FORMAT_VERSION || fingerprintBits !== FINGERPRINT_BITS || slotsPerBucket !== SLOTS_PER_BUCKET) {
    throw unsupported(`unsupported CKF format: version ${formatVersion}, ${fingerprintBits}-bit fingerprints, ${slotsPerBucket} slots per bucket`);
  }
  if (bucketCount > BigInt(MAX_RELAY_BUCKET_COUNT)) throw unsupported(`${what}.ckf_format.bucket_count ${bucketCount} exceeds ${MAX_RELAY_BUCKET_COUNT}`);
  if (bucketCount < 2n || (bucketCount & (bucketCount - 1n)) !== 0n) {
    throw malformed(`${what}.ckf_format.bucket_count ${bucketCount} is not a power of two of at least 2`);
  }
  if (producer.layoutGeneration === 0n) throw malformed(`${what}.layout_generation must not be 0`);
  return producerIdentity({
    poolId: id,
    producerIncarnation: producer.producerIncarnation,
    layoutGeneration: producer.layoutGeneration,
    format: formatIdentity(seed, Number(bucketCount)),
  });
}

export function producerToWire(producer: ProducerIdentity): WireProducerIdentity {
  const format = producer.format;
  return create(ProducerIdentitySchema, {
    poolId: poolIdToWire(producer.poolId),
    producerIncarnation: producer.producerIncarnation,
    layoutGeneration: producer.layoutGeneration,
    ckfFormat: create(CkfFormatSchema, {
      formatVersion: format.formatVersion,
      seed: format.seed,
      bucketCount: BigInt(format.bucketCount),
      fingerprintBits: format.fingerprintBits,
      slotsPerBucket: format.slotsPerBucket,
    }),
  });
}

// --- descriptor parts ----------------------------------------------------------

/** A Dynamo endpoint: namespace, component, endpoint. */
export interface EndpointId {
  readonly namespace: string;
  readonly component: string;
  readonly endpoint: string;
}

/** "namespace.component.endpoint". */
export function endpointName(id: EndpointId): string {
  return `${id.namespace}.${id.component}.${id.endpoint}`;
}

export function endpointFromWire(id: WireEndpointId | undefined, what = "serving_endpoint"): EndpointId {
  if (id === undefined) throw malformed(`${what} is required`);
  return Object.freeze({
    namespace: text(id.namespace, `${what}.namespace`),
    component: text(id.component, `${what}.component`),
    endpoint: text(id.endpoint, `${what}.endpoint`),
  });
}

export function endpointToWire(id: EndpointId): WireEndpointId {
  return create(DynamoEndpointIdSchema, { ...id });
}

export const WORKER_ROLES = ["PREFILL", "DECODE", "ENCODE", "AGGREGATED", "LEGACY"] as const;
export type WorkerRoleName = (typeof WORKER_ROLES)[number];

export function roleFromWire(role: WireWorkerRole, what: string): WorkerRoleName {
  if (role === WireWorkerRole.UNSPECIFIED) throw malformed(`${what} must not be UNSPECIFIED`);
  const name = WireWorkerRole[role] as string | undefined;
  if (name === undefined) throw unsupported(`${what} ${role as number} is not a known worker role`);
  return name as WorkerRoleName;
}

export function roleToWire(role: WorkerRoleName): WireWorkerRole {
  return WireWorkerRole[role];
}

/** pool_roles: non-empty, unique, none UNSPECIFIED. */
export function poolRolesFromWire(roles: readonly WireWorkerRole[], what = "pool_roles"): readonly WorkerRoleName[] {
  if (roles.length === 0) throw malformed(`${what} must not be empty`);
  const names = roles.map((role, i) => roleFromWire(role, `${what}[${i}]`));
  if (new Set(names).size !== names.length) throw malformed(`${what} must not repeat a role`);
  return Object.freeze(names);
}

export function querySemanticsFromWire(semantics: WireKvQuerySemantics | undefined, what = "query_semantics"): KvQuerySemantics {
  if (semantics === undefined) throw malformed(`${what} is required`);
  if (semantics.kvBlockSize === 0) throw malformed(`${what}.kv_block_size must be > 0`);
  switch (semantics.hashFormat) {
    case WireHashFormat.DYNAMO_STANDARD_V1:
      return createKvQuerySemantics(semantics.kvBlockSize, "DYNAMO_STANDARD_V1");
    case WireHashFormat.DYNAMO_EAGLE_V1:
      return createKvQuerySemantics(semantics.kvBlockSize, "DYNAMO_EAGLE_V1");
    case WireHashFormat.UNSPECIFIED:
      throw malformed(`${what}.hash_format must not be UNSPECIFIED`);
    default:
      throw unsupported(`${what}.hash_format ${semantics.hashFormat as number} is not a known hash format`);
  }
}

export function querySemanticsToWire(semantics: KvQuerySemantics): WireKvQuerySemantics {
  return create(KvQuerySemanticsSchema, { kvBlockSize: semantics.kvBlockSize, hashFormat: WireHashFormat[semantics.hashFormat] });
}

export function registrationFromWire(registration: WireModelRegistration, what = "registration"): CanonicalModelRegistration {
  const model = canonicalModelId(text(registration.canonicalModelId, `${what}.canonical_model_id`));
  const target = registration.target?.target;
  let modelTarget: ModelTarget;
  switch (target?.case) {
    case "base":
      modelTarget = { kind: "base", baseModel: canonicalModelId(text(target.value.baseModel, `${what}.target.base.base_model`)) };
      break;
    case "lora":
      modelTarget = {
        kind: "lora",
        baseModel: canonicalModelId(text(target.value.baseModel, `${what}.target.lora.base_model`)),
        adapter: canonicalModelId(text(target.value.adapter, `${what}.target.lora.adapter`)),
      };
      break;
    default:
      // An unset oneof may be a target kind this build does not know.
      throw unsupported(`${what}.target is not a known model target`);
  }
  const aliases = registration.aliases.map((alias, i) => modelAlias(text(alias, `${what}.aliases[${i}]`)));
  if (new Set(aliases).size !== aliases.length) throw malformed(`${what}.aliases must be unique`);
  return createRegistrationWithTarget(model, Object.freeze(modelTarget), aliases);
}

export function registrationToWire(registration: CanonicalModelRegistration): WireModelRegistration {
  const target = registration.target;
  return create(ModelRegistrationSchema, {
    canonicalModelId: registration.model,
    target: create(ModelTargetSchema, {
      target:
        target.kind === "base"
          ? { case: "base", value: { baseModel: target.baseModel } }
          : { case: "lora", value: { baseModel: target.baseModel, adapter: target.adapter } },
    }),
    aliases: [...registration.aliases],
  });
}

/** One pool as the catalog lists it. */
export interface PoolDescriptor {
  readonly producer: ProducerIdentity;
  readonly servingEndpoint: EndpointId;
  readonly registrations: readonly CanonicalModelRegistration[];
  readonly querySemantics: KvQuerySemantics;
  readonly poolRoles: readonly WorkerRoleName[];
}

export function descriptorFromWire(descriptor: WireKvPoolDescriptor, what = "pool"): PoolDescriptor {
  const registrations = descriptor.registrations.map((r, i) => registrationFromWire(r, `${what}.registrations[${i}]`));
  return Object.freeze({
    producer: producerFromWire(descriptor.producer, `${what}.producer`),
    servingEndpoint: endpointFromWire(descriptor.servingEndpoint, `${what}.serving_endpoint`),
    registrations: Object.freeze(registrations),
    querySemantics: querySemanticsFromWire(descriptor.querySemantics, `${what}.query_semantics`),
    poolRoles: poolRolesFromWire(descriptor.poolRoles, `${what}.pool_roles`),
  });
}

export function descriptorToWire(descriptor: PoolDescriptor): WireKvPoolDescriptor {
  return create(KvPoolDescriptorSchema, {
    producer: producerToWire(descriptor.producer),
    servingEndpoint: endpointToWire(descriptor.servingEndpoint),
    registrations: descriptor.registrations.map(registrationToWire),
    querySemantics: querySemanticsToWire(descriptor.querySemantics),
    poolRoles: descriptor.poolRoles.map(roleToWire),
  });
}
