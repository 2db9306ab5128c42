import { Writable } from "node:stream";
import { expect } from "chai";
import { pino } from "pino";
import { loadConfig, resolveConfig } from "../../src/server/index.js";
import { chooseLogFormat, createLogger, prettyDestination } from "../../src/cli/logger.js";

/** A writable that keeps what it is given. */
function sink(): { stream: Writable; text: () => string } {
  const chunks: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer | string, _enc, done) {
      chunks.push(chunk.toString());
      done();
    },
  });
  return { stream, text: () => chunks.join("") };
}

describe("log.format", () => {
  it("defaults to auto, and MMGATE_LOG_FORMAT sets it", () => {
    expect(resolveConfig({}, []).log.format).to.equal("auto");
    expect(loadConfig({ env: { MMGATE_LOG_FORMAT: "pretty" } }, []).log.format).to.equal("pretty");
    expect(() => resolveConfig({ log: { format: "text" } }, [])).to.throw(/log\.format/);
  });

  it("auto is pretty at a terminal and JSON otherwise; json and pretty are what they say", () => {
    expect(chooseLogFormat("auto", true)).to.equal("pretty");
    expect(chooseLogFormat("auto", false)).to.equal("json");
    for (const tty of [true, false]) {
      expect(chooseLogFormat("json", tty)).to.equal("json");
      expect(chooseLogFormat("pretty", tty)).to.equal("pretty");
    }
  });

  it("pretty writes the message as a readable line, synchronously, without JSON braces", async () => {
    const out = sink();
    const logger = pino({ level: "info" }, await prettyDestination(out.stream));
    logger.info("serving on 127.0.0.1:50051");
    // Written by the time info() returns: the order with other output stays as it is.
    const text = out.text();
    expect(text).to.include("INFO").and.include("serving on 127.0.0.1:50051");
    expect(text.trim()).to.not.match(/^\{/);
    expect(text).to.not.include('"msg"');
  });

  it("the process logger is JSON when stdout is not a terminal", async () => {
    const logger = await createLogger({ level: "warn", format: "auto" }, false);
    expect(logger.level).to.equal("warn");
    // pino's own stdout destination (sonic-boom), not pino-pretty's stream.
    const stream = (logger as unknown as Record<symbol, unknown>)[pino.symbols.streamSym];
    expect(stream?.constructor.name).to.equal("SonicBoom");
  });
});
