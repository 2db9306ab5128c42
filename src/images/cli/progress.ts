import { MultiBar, Presets, type SingleBar } from "cli-progress";
import type * as pb from "../../../gen/mmgate/images/v1/images_pb.js";
import type { CliIo } from "./io.js";

/** One bar per output: a step per partial preview, and one for completion. */
export class OutputProgress {
  private readonly multi: MultiBar | undefined;
  private readonly bars = new Map<number, SingleBar>();

  constructor(io: CliIo, outputs: number, private readonly steps: number) {
    if (!io.progress) return;
    this.multi = new MultiBar(
      { format: "output {index} [{bar}] {stage}", hideCursor: true, clearOnComplete: false, stream: io.err, noTTYOutput: true },
      Presets.shades_classic,
    );
    for (let index = 0; index < outputs; index += 1) {
      this.bars.set(index, this.multi.create(steps, 0, { index: String(index).padStart(2), stage: "queued" }));
    }
  }

  stage(index: number, stage: string): void {
    this.bars.get(index)?.update({ stage });
  }

  partial(index: number, partialIndex: number): void {
    this.bars.get(index)?.update(Math.min(partialIndex + 1, this.steps - 1), { stage: `preview ${partialIndex + 1}` });
  }

  finish(response: pb.ImageResponse | undefined): void {
    if (response) {
      for (const image of response.data) this.bars.get(image.index)?.update(this.steps, { stage: "done" });
      for (const failure of response.failures) this.bars.get(failure.index)?.update({ stage: "failed" });
    }
    this.multi?.stop();
  }
}
