// A thin, typed entry point to electric's gRPC API: a Connect client for
// EntityService over real gRPC (HTTP/2), plus helpers to read the
// google.rpc.ErrorInfo detail every electric error carries.
import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import { EntityService } from "./gen/electric/v1/entity_service_pb.js";
import { ErrorInfoSchema, type ErrorInfo } from "./gen/google/rpc/error_details_pb.js";

export * from "./gen/electric/v1/entity_service_pb.js";
export * from "./gen/electric/v1/types_pb.js";
export { ErrorInfoSchema, type ErrorInfo } from "./gen/google/rpc/error_details_pb.js";
export { Code, ConnectError } from "@connectrpc/connect";
// The HTTP wrapper (browser-safe on its own as "@electric/client/http"); a namespace, since its
// JSON shapes share names with the generated protobuf types (Entity, EntityRef, ...).
export * as http from "./http.js";
export { ElectricHttpClient, ElectricHttpError, readSse } from "./http.js";

/** The error domain of every electric ErrorInfo. */
export const ERROR_DOMAIN = "electric.v1";

export type ElectricClient = Client<typeof EntityService>;

export interface ElectricClientOptions {
  /** Bearer token, sent as `authorization: Bearer <token>` on every call. */
  token?: string;
}

/**
 * A client for EntityService at `address`: "host:port" for a plaintext
 * server (h2c, what `electric server` runs without --tls-cert), or a full
 * "http://host:port" / "https://host:port" URL.
 */
export function createElectricClient(address: string, options: ElectricClientOptions = {}): ElectricClient {
  const baseUrl = address.includes("://") ? address : `http://${address}`;
  const interceptors: Interceptor[] = [];
  const token = options.token;
  if (token !== undefined) {
    interceptors.push((next) => (req) => {
      req.header.set("authorization", `Bearer ${token}`);
      return next(req);
    });
  }
  // gRPC needs HTTP/2, the only protocol connect-node's gRPC transport speaks
  // (v2 has no httpVersion option for it); an http:// URL means h2c.
  const transport = createGrpcTransport({ baseUrl, interceptors });
  return createClient(EntityService, transport);
}

/** The google.rpc.ErrorInfo detail of an error from electric, if it has one. */
export function errorInfo(error: unknown): ErrorInfo | undefined {
  if (!(error instanceof ConnectError)) {
    return undefined;
  }
  return error.findDetails(ErrorInfoSchema)[0];
}

/** The ErrorInfo reason (e.g. "INVALID_SIGNAL") of an error from electric, if any. */
export function errorReason(error: unknown): string | undefined {
  return errorInfo(error)?.reason;
}

/** The gRPC status code of an error (Code.Unknown for anything not a ConnectError). */
export function errorCode(error: unknown): Code {
  return error instanceof ConnectError ? error.code : Code.Unknown;
}
