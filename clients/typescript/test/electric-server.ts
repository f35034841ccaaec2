// Runs a real electric server as a child process for the tests:
// `python -m electric_sdk.cli.main server --listen 127.0.0.1:0 --data <tmp> [args]`,
// ready once it prints "electric server listening on HOST:PORT" (and, with
// `--http`, "electric http listening on URL").
import { spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

// This file runs from clients/typescript/dist/test/: the repository root is
// four levels up. Only a plain `python3` (no installed electric) needs it.
const repoRoot = fileURLToPath(new URL("../../../../", import.meta.url));

export interface ElectricServer {
  /** "127.0.0.1:PORT" */
  address: string;
  /** "http://127.0.0.1:PORT" when started with `--http`. */
  httpUrl?: string;
  /** SIGTERM, then wait for the exit; resolves to the exit code. Idempotent. */
  stop(): Promise<number | null>;
}

export async function startElectricServer(args: string[] = []): Promise<ElectricServer> {
  const python = process.env.ELECTRIC_PYTHON || "python3";
  const dataDir = await mkdtemp(join(tmpdir(), "electric-ts-"));
  const child = spawn(
    python,
    ["-m", "electric_sdk.cli.main", "server", "--listen", "127.0.0.1:0", "--data", dataDir, "--drain-grace", "2s", ...args],
    { cwd: repoRoot, stdio: ["ignore", "pipe", "pipe"] },
  );
  // Keep draining stderr (the server logs there) so the pipe never fills.
  let stderr = "";
  child.stderr.setEncoding("utf8");
  child.stderr.on("data", (chunk: string) => {
    stderr = (stderr + chunk).slice(-16_384);
  });
  const exited = new Promise<number | null>((resolve) => {
    child.once("close", (code) => resolve(code));
  });

  let address: string;
  let httpUrl: string | undefined;
  try {
    address = await new Promise<string>((resolve, reject) => {
      const lines = createInterface({ input: child.stdout });
      let grpc: string | undefined;
      lines.on("line", (line) => {
        grpc ??= /^electric server listening on (\S+)$/.exec(line)?.[1];
        httpUrl ??= /^electric http listening on (\S+)$/.exec(line)?.[1];
        // The http line follows the gRPC one; without --http the banner's hints come next.
        if (grpc !== undefined && (httpUrl !== undefined || !args.includes("--http"))) resolve(grpc);
      });
      child.once("error", reject); // e.g. ENOENT: no such python
      child.once("exit", (code, signal) =>
        reject(new Error(`electric server (${python}) exited with ${code ?? signal} before it was ready:\n${stderr}`)),
      );
    });
  } catch (error) {
    child.kill("SIGKILL");
    await rm(dataDir, { recursive: true, force: true });
    throw error;
  }

  let stopping: Promise<number | null> | undefined;
  return {
    address,
    ...(httpUrl === undefined ? {} : { httpUrl }),
    stop() {
      stopping ??= (async () => {
        if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
        const code = await exited;
        await rm(dataDir, { recursive: true, force: true });
        return code;
      })();
      return stopping;
    },
  };
}
