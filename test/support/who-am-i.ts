/**
 * A test module whose ShapesService.Unary answers who the transport says is
 * calling: the verified client certificate's CN and serial
 * (`peerCertificateKey`), or "anonymous".
 */
import type { PeerCertificate } from "node:tls";
import { createClient } from "@connectrpc/connect";
import type { HandlerContext, Transport } from "@connectrpc/connect";
import { z } from "zod";
import { peerCertificateKey } from "../../src/server/caller.js";
import { bindService, defineModule } from "../../src/server/index.js";
import { ShapesService } from "./shapes-service.js";

export const whoAmIModule = defineModule({
  name: "whoAmI",
  description: "test: echoes the verified client certificate",
  configSchema: z.object({}),
  create: () => ({
    services: [
      bindService(ShapesService, {
        unary(_req: { value: string }, ctx: HandlerContext) {
          const peer: PeerCertificate | undefined = ctx.values.get(peerCertificateKey);
          return { value: peer === undefined ? "anonymous" : `${peer.subject.CN}/${peer.serialNumber}` };
        },
      } as never),
    ],
  }),
});

/** One ShapesService.Unary call on `transport`: who the server says is calling. */
export async function whoAmIOver(transport: Transport): Promise<string> {
  const client = createClient(ShapesService, transport) as unknown as Record<string, (req: object, options: object) => Promise<{ value: string }>>;
  return (await client["unary"]!({ value: "" }, { timeoutMs: 5000 })).value;
}
