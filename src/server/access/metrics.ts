import { Counter, Gauge, type Registry } from "prom-client";

/** Access control's metrics, in the host's registry. */
export class AccessMetrics {
  /** Reloads of the keys file after start, by result; a failed one left the keys loaded before in force. */
  readonly reloads: Counter<"result">;
  /** Bearer keys the server accepts now. */
  readonly keys: Gauge;

  constructor(registry: Registry) {
    this.reloads = new Counter({
      name: "mmgate_auth_keys_reload_total",
      help: "Reloads of auth.keysFile after a change, by result: ok (the new keys are in force) or error (the file was refused; the keys loaded before stay).",
      labelNames: ["result"],
      registers: [registry],
    });
    // Both series from the start, so that a rule can compare them before the first reload.
    for (const result of ["ok", "error"]) this.reloads.inc({ result }, 0);
    this.keys = new Gauge({
      name: "mmgate_auth_keys",
      help: "Bearer keys the server accepts: auth.token (as the key named token) and the keys of auth.keysFile, expired ones included.",
      registers: [registry],
    });
  }
}
