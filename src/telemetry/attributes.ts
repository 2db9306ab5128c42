/**
 * The OpenTelemetry semantic-convention attribute names mmgate's spans use,
 * written out rather than imported: the semantic-conventions package is a
 * megabyte of heap in every process that loads it, tracing on or off, for a
 * dozen strings. The names are the stable conventions' (HTTP, URL, server,
 * error, service) and the RPC ones tracing backends read for service graphs
 * (rpc.system, rpc.service, rpc.method, rpc.grpc.status_code), which the
 * package keeps only among its deprecated names since its RPC conventions
 * were renamed. A test holds them to the package's values.
 */
export const ATTR_ERROR_TYPE = "error.type";
export const ATTR_HTTP_REQUEST_METHOD = "http.request.method";
export const ATTR_HTTP_RESPONSE_STATUS_CODE = "http.response.status_code";
export const ATTR_HTTP_ROUTE = "http.route";
export const ATTR_NETWORK_PROTOCOL_VERSION = "network.protocol.version";
export const ATTR_SERVER_ADDRESS = "server.address";
export const ATTR_SERVER_PORT = "server.port";
export const ATTR_SERVICE_NAME = "service.name";
export const ATTR_SERVICE_VERSION = "service.version";
export const ATTR_URL_FULL = "url.full";
export const ATTR_URL_PATH = "url.path";
export const ATTR_URL_SCHEME = "url.scheme";

export const RPC_SYSTEM = "rpc.system";
export const RPC_SERVICE = "rpc.service";
export const RPC_METHOD = "rpc.method";
export const RPC_GRPC_STATUS_CODE = "rpc.grpc.status_code";
export const RPC_CONNECT_ERROR_CODE = "rpc.connect_rpc.error_code";
