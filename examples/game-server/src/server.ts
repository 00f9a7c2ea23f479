// A runnable table host: `node dist/src/server.js <host-id> <table-id> <hands>`.
// Loads the table, heartbeats, deals and settles hands (moving chips from a
// loser to a winner inside the fenced write's transaction), prints one JSON
// line per event, and releases its leases on SIGTERM.

import pg from "pg";
import { FencedError, TableHost } from "./tableHost.js";

const [hostId, tableArg, handsArg, ttlArg] = process.argv.slice(2);
const tableId = Number(tableArg);
const hands = Number(handsArg ?? "1000000");
const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 2 });
const host = new TableHost(pool, hostId, Number(ttlArg ?? "15000"));
const say = (event: object) => console.log(JSON.stringify({ host: hostId, pid: process.pid, ...event }));

host.onFreeze = (id, reason) => say({ event: "frozen", table: id, reason });

process.on("SIGTERM", async () => {
  const released = await host.shutdown();
  say({ event: "released", released });
  await pool.end();
  process.exit(0);
});

const token = await host.load(tableId);
if (token === undefined) {
  say({ event: "owned-elsewhere", table: tableId });
  await pool.end();
  process.exit(2);
}
say({ event: "loaded", table: tableId, token: token.toString() });
host.startHeartbeat();

for (let i = 0; i < hands; i++) {
  if (host.table(tableId)?.frozen) break;
  try {
    const winner = i % 2 === 0 ? "ann" : "bob";
    await host.settleHand(tableId, [{ player: winner, amount: 10 }]);
    say({ event: "settled", table: tableId, hand: host.table(tableId)?.hand });
  } catch (err) {
    if (err instanceof FencedError) {
      say({ event: "refused", table: tableId, code: err.code });
      break;
    }
    throw err;
  }
  await new Promise((r) => setTimeout(r, 20));
}
await new Promise((r) => setTimeout(r, 100));
say({ event: "idle" });
// Stay up (heartbeating) until SIGTERM, as a real server would.
