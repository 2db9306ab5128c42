/** `images generate`: the request from the options, the call (streamed or not), saving and printing its result. */
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import type { ProviderCapabilities } from "../../../gen/mmgate/images/v1/capabilities_pb.js";
import { ImageService } from "../../../gen/mmgate/images/v1/image_service_pb.js";
import * as pb from "../../../gen/mmgate/images/v1/images_pb.js";
import { clientTransport, CliError, connectionContext, type ConnectionOptions, reportError, reportWarning, usageError } from "../../rpc/index.js";
import { COMMAND, describe, type CliIo } from "./io.js";
import { indexWidth, partialName, prepareOutDir, saveImages, sniffExtension, type SaveContext } from "./output-dir.js";
import { OutputProgress } from "./progress.js";
import { callError, printResult } from "./render.js";

const DEFAULT_STREAM_PARTIALS = 2;

export interface GenerateOptions extends ConnectionOptions {
  count: number;
  /** The old spelling of --count. */
  n?: number;
  /** The old spelling of --timeout (the request's timeout_ms only). */
  timeoutMs?: number;
  json?: boolean;
  out: string;
  token?: string;
  provider?: string;
  model?: string;
  size?: string;
  format?: number;
  quality?: number;
  background?: number;
  partials?: number;
  bestEffort?: boolean;
  sequential?: boolean;
  normalize?: boolean;
  stream?: boolean;
  savePartials?: boolean;
  negative?: string;
}

/** The largest timeout_ms a server takes by default (images.limits.maxTimeoutMs). */
const MAX_REQUEST_TIMEOUT_MS = 1_800_000;

function imageRequest(prompt: string, o: GenerateOptions): pb.ImageRequest {
  return create(pb.ImageRequestSchema, {
    prompt,
    ...(o.negative !== undefined ? { negativePrompt: o.negative } : {}),
    operation: { case: "generate", value: {} },
    parameters: {
      n: o.count,
      size: o.size ?? "",
      quality: o.quality ?? 0,
      outputFormat: o.format ?? 0,
      background: o.background ?? 0,
      partialImages: o.partials ?? 0,
      failurePolicy: o.bestEffort ? pb.FailurePolicy.BEST_EFFORT : pb.FailurePolicy.FAIL_FAST,
    },
    routing: { provider: o.provider ?? "", model: o.model ?? "" },
    policies: {
      compatibility: o.normalize ? pb.CompatibilityMode.NORMALIZE : pb.CompatibilityMode.STRICT,
      batchExecution: o.sequential ? pb.BatchExecution.SEQUENTIAL : pb.BatchExecution.AUTO,
    },
    // The server ends the work at the same deadline the call has (a longer one is the server's to bound).
    ...(o.timeout !== undefined && o.timeout > 0 && o.timeout <= MAX_REQUEST_TIMEOUT_MS ? { timeoutMs: BigInt(o.timeout) } : {}),
    responseFormat: pb.ResponseFormat.BYTES,
  });
}

export async function generate(prompt: string, o: GenerateOptions, io: CliIo): Promise<number> {
  const context = connectionContext(o);
  const fail = (error: unknown, caps?: ProviderCapabilities) => reportError(io.err, COMMAND, callError(error, caps), context);
  // The old spellings, kept working: --n for --count, --timeout-ms for --timeout.
  if (o.n !== undefined) o.count = o.n;
  if (o.timeoutMs !== undefined && !(o.timeout !== undefined && o.timeout > 0)) o.timeout = o.timeoutMs;
  try {
    if (o.savePartials && !o.stream) throw usageError("--save-partials needs --stream");
    await prepareOutDir(o.out);
  } catch (error) {
    return fail(error);
  }
  const ctx: SaveContext = { out: o.out, width: indexWidth(o.count), partials: new Set() };
  let partialWriteFailed = false;
  let caps: ProviderCapabilities | undefined;
  let client;
  try {
    client = createClient(ImageService, clientTransport(o));
  } catch (error) {
    return fail(error);
  }
  const headers = o.token ? { authorization: `Bearer ${o.token}` } : undefined;
  try {
    caps = (await client.getCapabilities({ provider: o.provider ?? "", model: o.model ?? "" }, headers ? { headers } : {})).capabilities;
  } catch (error) {
    return fail(error);
  }
  const limit = caps?.count?.max;
  if (limit !== undefined && limit > 0 && o.count > limit) {
    return fail(usageError(`-n ${o.count} is above the limit of ${caps!.provider}: at most ${limit} image(s) per request`));
  }
  try {
    let partials = o.partials;
    if (partials === undefined && o.stream) {
      // Two previews by default, within what the provider offers.
      partials = Math.min(DEFAULT_STREAM_PARTIALS, caps?.partialImages?.max ?? 0);
    }
    const request = imageRequest(prompt, { ...o, ...(partials !== undefined ? { partials } : {}) });
    let completed: pb.ImageResponse | undefined;
    if (!o.stream) {
      completed = (await client.generate({ request }, headers ? { headers } : {})).response;
    } else {
      const steps = (request.parameters?.partialImages ?? 0) + 1;
      const progress = new OutputProgress(io, o.count, steps);
      try {
        for await (const message of client.generateStream({ request }, headers ? { headers } : {})) {
          const event = message.event;
          if (event.case === "progress") progress.stage(event.value.index, event.value.stage);
          else if (event.case === "partialImage") {
            progress.partial(event.value.index, event.value.partialIndex);
            if (o.savePartials && !partialWriteFailed) {
              const name = partialName(event.value.index, event.value.partialIndex, sniffExtension(event.value.image), ctx.width);
              try {
                await writeFile(join(o.out, name), event.value.image);
                ctx.partials.add(name);
              } catch (error) {
                partialWriteFailed = true;
                reportWarning(io.err, COMMAND, `could not save previews: ${describe(error)}`);
              }
            }
          } else if (event.case === "completed") completed = event.value.response;
        }
      } finally {
        progress.finish(completed);
      }
    }
    if (!completed) throw new CliError("internal", "the server's answer has no result");
    const saved = await saveImages(completed, ctx);
    return printResult(completed, saved, ctx, io, o.json === true, caps);
  } catch (error) {
    return fail(error, caps);
  }
}
