// A Pi extension for running Pi unattended against a model that may never stop calling tools:
// it aborts the run after REEF_PI_MAX_TURNS turns (Pi has no turn limit of its own), and appends
// each model response's HTTP status and Reef record id to REEF_PI_LOG (JSON lines), so a test can
// check what the gateway answered without parsing Pi's output.
import { appendFileSync } from "node:fs";
import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";

export default function (pi: ExtensionAPI) {
	const maxTurns = Number(process.env.REEF_PI_MAX_TURNS ?? "4");
	const logFile = process.env.REEF_PI_LOG;
	let turns = 0;

	pi.on("after_provider_response", (event) => {
		if (!logFile) return;
		const headers = event.headers as Record<string, string>;
		appendFileSync(logFile, JSON.stringify({
			status: event.status,
			record_id: headers["x-reef-agent-record-id"] ?? null,
		}) + "\n", "utf8");
	});

	pi.on("turn_end", async (_event, ctx) => {
		turns += 1;
		if (turns >= maxTurns) ctx.abort();
	});
}
