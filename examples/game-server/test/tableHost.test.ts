// The example client against a real cluster, as the application role with
// README's grants (Roles and grants), never as a superuser. Environment:
//   PG_LEASE_TEST_HOST (127.0.0.1), PG_LEASE_TEST_PORT (5432; make test sets it),
//   PG_LEASE_TEST_ADMIN (postgres): a superuser that creates the scratch
//   database, the schema and the role, and drops them afterwards.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { FencedError, TableHost } from "../src/tableHost.js";

const host = process.env.PG_LEASE_TEST_HOST ?? "127.0.0.1";
const port = Number(process.env.PG_LEASE_TEST_PORT ?? "5432");
const adminUser = process.env.PG_LEASE_TEST_ADMIN ?? "postgres";
const database = `ts_game_${process.pid}`;
const appRole = `ts_game_server_${process.pid}`;
const adminUrl = (db: string) => `postgres://${adminUser}@${host}:${port}/${db}`;
const url = `postgres://${appRole}@${host}:${port}/${database}`;
let pool: pg.Pool | undefined;
let admin: pg.Pool | undefined;

async function asAdmin(db: string, sql: string): Promise<void> {
  const c = new pg.Client({ connectionString: adminUrl(db) });
  try {
    await c.connect();
  } catch (err) {
    throw new Error(
      `cannot reach PostgreSQL as ${adminUser} at ${host}:${port} (${(err as Error).message}); ` +
        "start a server with pg_lease installed and set PG_LEASE_TEST_HOST / PG_LEASE_TEST_PORT / PG_LEASE_TEST_ADMIN",
    );
  }
  try {
    await c.query(sql);
  } finally {
    await c.end();
  }
}

before(async () => {
  await asAdmin("postgres", `CREATE DATABASE ${database}`);
  await asAdmin(database, `
    CREATE EXTENSION pg_lease;
    CREATE ROLE ${appRole} LOGIN;
    CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
    CREATE TABLE payouts (id bigint GENERATED ALWAYS AS IDENTITY, table_id int NOT NULL REFERENCES tables,
                          hand int NOT NULL, player text NOT NULL, amount bigint NOT NULL,
                          fencing_token bigint NOT NULL);
    SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
    INSERT INTO tables (id) SELECT generate_series(1, 10);
    -- the game server's grants from README (Roles and grants), nothing more
    GRANT SELECT ON tables TO ${appRole};
    GRANT SELECT, INSERT ON payouts TO ${appRole};
    GRANT EXECUTE ON FUNCTION lease.acquire(text, text, integer, regclass, text[]),
        lease.try_acquire(text, text, integer, regclass, text[]), lease.renew(text, text, bigint, integer),
        lease.heartbeat(text, integer), lease.renew_all(text, integer), lease.release(text, text, bigint),
        lease.release_all(text) TO ${appRole};`);
  pool = new pg.Pool({ connectionString: url });
  admin = new pg.Pool({ connectionString: adminUrl(database), max: 1 });
});

after(async () => {
  await pool?.end();
  await admin?.end();
  if (pool) {
    await asAdmin("postgres", `DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
    await asAdmin("postgres", `DROP ROLE IF EXISTS ${appRole}`);
  }
});

test("a stale payout freezes the table and is never retried", async () => {
  const old = new TableHost(pool!, "host-1");
  const frozen: string[] = [];
  old.onFreeze = (_id, reason) => frozen.push(reason);
  const t1 = await old.load(1);
  assert.ok(t1 !== undefined);
  assert.equal(await old.settleHand(1, [{ player: "ann", amount: 10 }]), 1);

  // A new process of the same host revives the table: the token is bumped.
  const fresh = new TableHost(pool!, "host-1");
  const t2 = await fresh.load(1);
  assert.ok(t2 !== undefined && t2 > t1!);

  await assert.rejects(old.settleHand(1, [{ player: "ann", amount: 10 }]), (err: unknown) => {
    assert.ok(err instanceof FencedError);
    assert.equal(err.code, "LF001");
    return true;
  });
  assert.equal(old.table(1)?.frozen, true);
  assert.equal(frozen.length, 1);
  await assert.rejects(old.settleHand(1, []), /not hosted here/);

  assert.equal(await fresh.settleHand(1, [{ player: "bob", amount: 10 }]), 1);
  const { rows } = await pool!.query("SELECT hand, fencing_token FROM payouts WHERE table_id = 1 ORDER BY id");
  assert.deepEqual(rows.map((r) => [r.hand, BigInt(r.fencing_token)]), [[1, t1], [2, t2]]);
});

test("another host's live lease keeps a table from loading", async () => {
  const a = new TableHost(pool!, "host-a");
  const b = new TableHost(pool!, "host-b");
  assert.ok((await a.load(5)) !== undefined);
  assert.equal(await b.load(5), undefined);
  assert.equal(await a.shutdown(), 1);
  assert.ok((await b.load(5)) !== undefined, "released: taken at once");
});

test("the heartbeat freezes a table whose lease was lost", async () => {
  const slow = new TableHost(pool!, "host-slow", 300);
  const reasons: string[] = [];
  slow.onFreeze = (_id, reason) => reasons.push(reason);
  await slow.load(2);
  await new Promise((r) => setTimeout(r, 450)); // paused past its TTL
  const other = new TableHost(pool!, "host-other");
  assert.ok((await other.load(2)) !== undefined);
  await slow.heartbeat();
  assert.deepEqual(reasons, ["lease lost (taken)"]);
  assert.equal(slow.table(2)?.frozen, true);
});

type Proc = { child: ChildProcessWithoutNullStreams; events: Record<string, unknown>[]; waitFor: (e: string, n?: number) => Promise<void> };

function startServer(hostId: string, tableId: number): Proc {
  const script = fileURLToPath(new URL("../src/server.js", import.meta.url));
  const child = spawn(process.execPath, [script, hostId, String(tableId)], { env: { ...process.env, DATABASE_URL: url } });
  const events: Record<string, unknown>[] = [];
  const waiters: (() => void)[] = [];
  createInterface({ input: child.stdout }).on("line", (line) => {
    events.push(JSON.parse(line));
    waiters.splice(0).forEach((w) => w());
  });
  child.stderr.on("data", (d) => process.stderr.write(d));
  const waitFor = (event: string, n = 1) =>
    new Promise<void>((resolve, reject) => {
      const deadline = setTimeout(() => reject(new Error(`${hostId}: no ${n}x ${event}; saw ${JSON.stringify(events)}`)), 20_000);
      const check = () => {
        if (events.filter((e) => e.event === event).length >= n) {
          clearTimeout(deadline);
          resolve();
        } else waiters.push(check);
      };
      check();
    });
  return { child, events, waitFor };
}

test("deploy overlap: two processes, the old one is refused and freezes", async () => {
  const oldProc = startServer("host-7", 3);
  await oldProc.waitFor("settled", 5);
  // The deploy starts the new build while the old one is still dealing.
  const newProc = startServer("host-7", 3);
  await newProc.waitFor("loaded");
  await oldProc.waitFor("refused");
  await newProc.waitFor("settled", 5);

  const refused = oldProc.events.find((e) => e.event === "refused");
  assert.equal(refused?.code, "LF001");
  assert.ok(oldProc.events.some((e) => e.event === "frozen"));

  const exited = new Promise((r) => newProc.child.on("exit", r));
  newProc.child.kill("SIGTERM");
  await exited;
  assert.ok(newProc.events.some((e) => e.event === "released"));
  oldProc.child.kill("SIGKILL");

  // Every hand was paid at most once, and only under the token current when it was paid.
  const dup = await pool!.query("SELECT hand FROM payouts WHERE table_id = 3 GROUP BY hand HAVING count(*) > 1");
  assert.equal(dup.rowCount, 0);
  const newToken = BigInt(String(newProc.events.find((e) => e.event === "loaded")?.token));
  const late = await pool!.query(
    "SELECT count(*)::int AS n FROM payouts WHERE table_id = 3 AND fencing_token < $1 AND hand > (SELECT min(hand) FROM payouts WHERE table_id = 3 AND fencing_token = $1)",
    [newToken.toString()],
  );
  assert.equal(late.rows[0].n, 0);
  const live = await admin!.query("SELECT live FROM lease.leases WHERE name = 'table:3'");
  assert.equal(live.rows[0].live, false, "SIGTERM released the lease");
});
