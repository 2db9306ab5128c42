import { getOption } from "@bufbuild/protobuf";
import { expect } from "chai";
import { EncodeHopService, EncodeWorkerService, GenerateRequestSchema as HopRequestSchema, GenerateResponseSchema as HopResponseSchema } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { GenerateRequestSchema, GenerateResponseSchema, TokenWorkerService } from "../../gen/mmgate/llm/v1/token_worker_pb.js";
import { Access, access } from "../../gen/mmgate/options/v1/options_pb.js";
import type { DescMessage, DescService } from "@bufbuild/protobuf";

const kinds = (s: DescService) => Object.fromEntries(s.methods.map((m) => [m.name, m.methodKind]));
const accessOf = (s: DescService) => Object.fromEntries(s.methods.map((m) => [m.name, Access[getOption(m, access)]]));
const shape = (m: DescMessage) => m.fields.map((f) => [f.number, f.name, f.fieldKind, f.message?.typeName]);

describe("llm and encode: generated service contracts", () => {
  it("TokenWorkerService.Generate is server streaming and needs the token", () => {
    expect(TokenWorkerService.typeName).to.equal("mmgate.llm.v1.TokenWorkerService");
    expect(kinds(TokenWorkerService)).to.deep.equal({ Generate: "server_streaming" });
    expect(accessOf(TokenWorkerService)).to.deep.equal({ Generate: "MUTATING" });
  });

  it("EncodeWorkerService.Encode is server streaming over the llm messages", () => {
    expect(kinds(EncodeWorkerService)).to.deep.equal({ Encode: "server_streaming" });
    expect(accessOf(EncodeWorkerService)).to.deep.equal({ Encode: "MUTATING" });
    expect(EncodeWorkerService.method.encode.input.fields[0]?.message?.typeName).to.equal("mmgate.llm.v1.PreprocessedRequest");
    expect(EncodeWorkerService.method.encode.output.fields[0]?.message?.typeName).to.equal("mmgate.llm.v1.AnnotatedOutput");
  });

  it("EncodeHopService has a streaming Generate and a unary GetStatus", () => {
    expect(kinds(EncodeHopService)).to.deep.equal({ Generate: "server_streaming", GetStatus: "unary" });
    expect(accessOf(EncodeHopService)).to.deep.equal({ Generate: "MUTATING", GetStatus: "PUBLIC" });
  });

  it("EncodeHopService.Generate has the wire shape of TokenWorkerService.Generate", () => {
    expect(shape(HopRequestSchema)).to.deep.equal(shape(GenerateRequestSchema));
    expect(shape(HopResponseSchema)).to.deep.equal(shape(GenerateResponseSchema));
  });
});
