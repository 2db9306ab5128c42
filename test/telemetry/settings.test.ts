import { expect } from "chai";
import { resolveConfig } from "../../src/server/config/index.js";
import { resolveTracingSettings, TelemetryConfigError, type TracingSection } from "../../src/telemetry/index.js";

const defaults = (): TracingSection => resolveConfig({}, []).telemetry.tracing;

describe("telemetry: tracing settings from telemetry.tracing and the OTEL_* variables", () => {
  it("is off by default, with the OTLP defaults ready", () => {
    const s = resolveTracingSettings(defaults(), {});
    expect(s).to.deep.include({ enabled: false, url: "http://localhost:4318/v1/traces", protocol: "http/protobuf", serviceName: "mmgate", sampler: 1 });
  });

  it("OTEL_EXPORTER_OTLP_ENDPOINT alone turns it on, /v1/traces appended", () => {
    expect(resolveTracingSettings(defaults(), { OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318" })).to.deep.include({
      enabled: true,
      url: "http://collector:4318/v1/traces",
    });
    expect(resolveTracingSettings(defaults(), { OTEL_EXPORTER_OTLP_ENDPOINT: "https://collector/otlp/" }).url).to.equal("https://collector/otlp/v1/traces");
  });

  it("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as it is, and wins", () => {
    const s = resolveTracingSettings(defaults(), { OTEL_EXPORTER_OTLP_ENDPOINT: "http://a:4318", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://b:9999/traces" });
    expect(s).to.deep.include({ enabled: true, url: "http://b:9999/traces" });
  });

  it("the config section: enabled, endpoint, protocol, serviceName, sampleRatio; the variables win", () => {
    const section = resolveConfig({ telemetry: { tracing: { enabled: true, endpoint: "http://c:4318", protocol: "http/json", serviceName: "hop", sampleRatio: 0.25 } } }, []).telemetry.tracing;
    expect(resolveTracingSettings(section, {})).to.deep.include({ enabled: true, url: "http://c:4318/v1/traces", protocol: "http/json", serviceName: "hop", sampler: 0.25 });
    expect(
      resolveTracingSettings(section, { OTEL_SERVICE_NAME: "other", OTEL_EXPORTER_OTLP_PROTOCOL: "http/protobuf", OTEL_TRACES_SAMPLER: "always_on" }),
    ).to.deep.include({ serviceName: "other", protocol: "http/protobuf", sampler: "env" });
    expect(resolveTracingSettings(section, { OTEL_EXPORTER_OTLP_PROTOCOL: "http/protobuf", OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "http/json" }).protocol).to.equal("http/json");
  });

  it("OTEL_SDK_DISABLED=true and OTEL_TRACES_EXPORTER=none turn it off whatever else says", () => {
    const on = resolveConfig({ telemetry: { tracing: { enabled: true } } }, []).telemetry.tracing;
    expect(resolveTracingSettings(on, { OTEL_SDK_DISABLED: "true", OTEL_EXPORTER_OTLP_ENDPOINT: "http://a:4318" }).enabled).to.equal(false);
    expect(resolveTracingSettings(on, { OTEL_TRACES_EXPORTER: "none" }).enabled).to.equal(false);
  });

  it("refuses what it cannot do, naming the variable", () => {
    const bad: [Record<string, string>, RegExp][] = [
      [{ OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" }, /^OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" is not supported.*OTLP\/HTTP port/],
      [{ OTEL_EXPORTER_OTLP_ENDPOINT: "collector:4318" }, /^OTEL_EXPORTER_OTLP_ENDPOINT: expected an http/],
      [{ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "not a url" }, /^OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "not a url" is not a URL/],
      [{ OTEL_TRACES_SAMPLER: "sometimes" }, /^OTEL_TRACES_SAMPLER: "sometimes" is not one of/],
      [{ OTEL_TRACES_SAMPLER: "traceidratio", OTEL_TRACES_SAMPLER_ARG: "2" }, /^OTEL_TRACES_SAMPLER_ARG: "2" is not a ratio/],
      [{ OTEL_TRACES_EXPORTER: "zipkin" }, /^OTEL_TRACES_EXPORTER: "zipkin" is not supported/],
    ];
    for (const [env, message] of bad) {
      expect(() => resolveTracingSettings(defaults(), env), JSON.stringify(env)).to.throw(TelemetryConfigError, message);
    }
  });

  it("the config schema refuses an endpoint that is not an http(s) URL and a ratio outside 0..1", () => {
    expect(() => resolveConfig({ telemetry: { tracing: { endpoint: "collector:4318" } } }, [])).to.throw(/telemetry\.tracing\.endpoint/);
    expect(() => resolveConfig({ telemetry: { tracing: { sampleRatio: 1.5 } } }, [])).to.throw(/telemetry\.tracing\.sampleRatio/);
  });
});
