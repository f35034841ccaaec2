// `npm run prepare`: npm runs it after `npm install` here, and when another project installs this
// folder (`npm install path/to/clients/typescript`). A folder installed that way is linked, and npm
// does not install its own dependencies into it: install them first (scripts off, so this does not
// run again), then build dist/, which the package's `main` and `types` point to.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL("..", import.meta.url));
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
if (!existsSync(`${here}node_modules/.bin/tsc`)) {
  execFileSync(npm, ["install", "--no-audit", "--no-fund", "--ignore-scripts"], { cwd: here, stdio: "inherit" });
}
execFileSync(npm, ["run", "build"], { cwd: here, stdio: "inherit" });
