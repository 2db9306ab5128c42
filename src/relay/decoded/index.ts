// CBI1 frames as protobuf (mmgate.kvrelay.v1): the conversion both ways and
// the services that decode single frames and whole pool streams.
export { frameFromProto, frameToProto, type FrameToProtoOptions } from "./frame-proto.js";
export { cbi1ErrorToConnect, cbi1Service, decodedRelayService } from "./service.js";
