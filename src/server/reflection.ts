import type { DescEnum, DescExtension, DescFile, DescMessage, DescService, MessageInitShape } from "@bufbuild/protobuf";
import { toBinary } from "@bufbuild/protobuf";
import type { FileDescriptorProto } from "@bufbuild/protobuf/wkt";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import type { ConnectRouter } from "@connectrpc/connect";
import { Code } from "@connectrpc/connect";
import * as v1 from "../../gen/grpc/reflection/v1/reflection_pb.js";
import { untilAborted } from "../util/index.js";
import * as v1alpha from "../../gen/grpc/reflection/v1alpha/reflection_pb.js";
import type { DescriptorImage } from "./reflection-image.js";
import { loadDescriptorImage } from "./reflection-image.js";

type Request = v1.ServerReflectionRequest;
type Response = MessageInitShape<typeof v1.ServerReflectionResponseSchema>;

/**
 * Everything reflection can answer, built once from the descriptors that
 * protoc-gen-es embeds in the generated code: each file reachable from the
 * exposed services, every symbol it defines, and every extension. A file is
 * served from the descriptor image (with its comments) when the image has it
 * and describes the same schema; else as embedded.
 */
export class DescriptorIndex {
  readonly serviceNames: readonly string[];
  private readonly files = new Map<string, DescFile>();
  private readonly fileBytes = new Map<string, Uint8Array>();
  private readonly symbols = new Map<string, DescFile>();
  private readonly extensions = new Map<string, Map<number, DescFile>>();
  private readonly messageTypes = new Set<string>();
  private image: DescriptorImage = new Map();

  constructor(services: readonly DescService[]) {
    this.serviceNames = [...new Set(services.map((s) => s.typeName))].sort();
    for (const service of services) this.addFile(service.file);
  }

  private addFile(file: DescFile): void {
    const name = file.proto.name;
    if (this.files.has(name)) return;
    this.files.set(name, file);
    for (const dep of file.dependencies) this.addFile(dep);
    const pkg = file.proto.package;
    for (const message of file.messages) this.addMessage(file, message);
    for (const en of file.enums) this.addEnum(file, en, pkg);
    for (const ext of file.extensions) this.addExtension(file, ext);
    for (const service of file.services) {
      this.symbols.set(service.typeName, file);
      for (const method of service.methods) this.symbols.set(`${service.typeName}.${method.name}`, file);
    }
  }

  private addMessage(file: DescFile, message: DescMessage): void {
    this.symbols.set(message.typeName, file);
    this.messageTypes.add(message.typeName);
    for (const field of message.fields) this.symbols.set(`${message.typeName}.${field.name}`, file);
    for (const oneof of message.oneofs) this.symbols.set(`${message.typeName}.${oneof.name}`, file);
    for (const nested of message.nestedMessages) this.addMessage(file, nested);
    for (const en of message.nestedEnums) this.addEnum(file, en, message.typeName);
    for (const ext of message.nestedExtensions) this.addExtension(file, ext);
  }

  // Enum values are scoped as siblings of their enum, as protoc scopes them.
  private addEnum(file: DescFile, en: DescEnum, scope: string): void {
    this.symbols.set(en.typeName, file);
    for (const value of en.values) this.symbols.set(scope === "" ? value.name : `${scope}.${value.name}`, file);
  }

  private addExtension(file: DescFile, ext: DescExtension): void {
    this.symbols.set(ext.typeName, file);
    let byNumber = this.extensions.get(ext.extendee.typeName);
    if (!byNumber) this.extensions.set(ext.extendee.typeName, (byNumber = new Map()));
    byNumber.set(ext.number, file);
  }

  fileByName(name: string): DescFile | undefined {
    return this.files.get(name);
  }

  fileBySymbol(symbol: string): DescFile | undefined {
    return this.symbols.get(stripDot(symbol));
  }

  fileByExtension(containingType: string, number: number): DescFile | undefined {
    return this.extensions.get(stripDot(containingType))?.get(number);
  }

  /** Extension numbers known for a message type, or undefined for an unknown type. */
  extensionNumbers(typeName: string): number[] | undefined {
    const name = stripDot(typeName);
    if (!this.messageTypes.has(name)) return undefined;
    return [...(this.extensions.get(name)?.keys() ?? [])].sort((a, b) => a - b);
  }

  /** The file first, then its transitive dependencies, each once. */
  serializeWithDependencies(file: DescFile): Uint8Array[] {
    const out: Uint8Array[] = [];
    const seen = new Set<string>();
    const visit = (f: DescFile) => {
      if (seen.has(f.proto.name)) return;
      seen.add(f.proto.name);
      out.push(this.serialize(f));
      for (const dep of f.dependencies) visit(dep);
    };
    visit(file);
    return out;
  }

  /** Serves files from `image` where it matches the embedded descriptors (see reflection-image.ts). */
  useImage(image: DescriptorImage): void {
    this.image = image;
    this.fileBytes.clear();
  }

  private serialize(file: DescFile): Uint8Array {
    let bytes = this.fileBytes.get(file.proto.name);
    if (!bytes) this.fileBytes.set(file.proto.name, (bytes = serializeFile(file.proto, this.image.get(file.proto.name))));
    return bytes;
  }
}

/**
 * The documented descriptor when, without its comments, it is byte for byte
 * the embedded one: the stubs are what the server speaks, so an image out of
 * step with them (proto/ changed, the image not rebuilt) must not describe it.
 */
function serializeFile(embedded: FileDescriptorProto, documented: FileDescriptorProto | undefined): Uint8Array {
  const plain = toBinary(FileDescriptorProtoSchema, embedded);
  if (!documented?.sourceCodeInfo) return plain;
  const bare = toBinary(FileDescriptorProtoSchema, { ...documented, sourceCodeInfo: undefined });
  return bytesEqual(bare, plain) ? toBinary(FileDescriptorProtoSchema, documented) : plain;
}

function bytesEqual(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((byte, i) => byte === b[i]);
}

function stripDot(name: string): string {
  return name.startsWith(".") ? name.slice(1) : name;
}

function notFound(message: string): Response["messageResponse"] {
  return { case: "errorResponse", value: { errorCode: Code.NotFound, errorMessage: message } };
}

/** Answers one reflection request; never throws. */
export function answerReflection(index: DescriptorIndex, req: Request): Response {
  const files = (file: DescFile | undefined, missing: string): Response["messageResponse"] =>
    file
      ? { case: "fileDescriptorResponse", value: { fileDescriptorProto: index.serializeWithDependencies(file) } }
      : notFound(missing);
  let messageResponse: Response["messageResponse"];
  const r = req.messageRequest;
  switch (r.case) {
    case "listServices":
      messageResponse = {
        case: "listServicesResponse",
        value: { service: index.serviceNames.map((name) => ({ name })) },
      };
      break;
    case "fileByFilename":
      messageResponse = files(index.fileByName(r.value), `file ${r.value} not found`);
      break;
    case "fileContainingSymbol":
      messageResponse = files(index.fileBySymbol(r.value), `symbol ${r.value} not found`);
      break;
    case "fileContainingExtension": {
      const { containingType, extensionNumber } = r.value;
      messageResponse = files(
        index.fileByExtension(containingType, extensionNumber),
        `extension ${containingType}#${extensionNumber} not found`,
      );
      break;
    }
    case "allExtensionNumbersOfType": {
      const numbers = index.extensionNumbers(r.value);
      messageResponse = numbers
        ? { case: "allExtensionNumbersResponse", value: { baseTypeName: stripDot(r.value), extensionNumber: numbers } }
        : notFound(`type ${r.value} not found`);
      break;
    }
    default:
      messageResponse = {
        case: "errorResponse",
        value: { errorCode: Code.Unimplemented, errorMessage: "unsupported reflection request" },
      };
  }
  return { validHost: req.host, originalRequest: req, messageResponse };
}

/** The two reflection services, for the index and for registration. */
export const reflectionServices: readonly DescService[] = [v1.ServerReflection, v1alpha.ServerReflection];

/**
 * Registers grpc.reflection.v1 and v1alpha on the router. The two versions
 * are wire-identical, so the v1alpha handler reuses the v1 answer. A stream
 * ends cleanly when `drainSignal` fires: clients keep reflection streams
 * open, and an open one would otherwise hold shutdown for the whole grace.
 */
export function addReflection(
  router: ConnectRouter,
  services: readonly DescService[],
  drainSignal: AbortSignal = new AbortController().signal,
): DescriptorIndex {
  const index = new DescriptorIndex([...services, ...reflectionServices]);
  // The image is read on the first reflection request, not at start-up.
  let imageReady: Promise<void> | undefined;
  const ready = () => (imageReady ??= loadDescriptorImage().then((image) => index.useImage(image)));
  router.service(v1.ServerReflection, {
    async *serverReflectionInfo(requests) {
      for await (const req of untilAborted(requests, drainSignal)) {
        await ready();
        yield answerReflection(index, req);
      }
    },
  });
  router.service(v1alpha.ServerReflection, {
    async *serverReflectionInfo(requests) {
      for await (const req of untilAborted(requests, drainSignal)) {
        await ready();
        // Same field numbers and types: the v1alpha request fits the v1 answerer.
        yield answerReflection(index, req as unknown as Request) as MessageInitShape<
          typeof v1alpha.ServerReflectionResponseSchema
        >;
      }
    },
  });
  return index;
}
