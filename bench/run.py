#!/usr/bin/env python3
"""`make bench`: pg_lease measured side by side against what users would use instead.

Starts a scratch cluster with fixed settings, runs every workload with pgbench
custom scripts (-M prepared), interleaves the variants (A B C A B C ...) for
BENCH_RUNS rounds, and prints one Markdown table of medians, min-max and ratios.
The same table, the machine and the settings go to BENCHMARKS.md, with a chart
of pg_lease's ratio to the baseline per workload in bench/ratios.svg.
"""

import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PORT = int(os.environ.get("BENCH_PORT", "54450"))
REDIS_PORT = PORT + 1
RUNS = int(os.environ.get("BENCH_RUNS", "5"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "5"))
CLIENTS = 4
SETTINGS = [
    "fsync = on",
    "synchronous_commit = on",
    "shared_buffers = '512MB'",
    "max_wal_size = '4GB'",
    "checkpoint_timeout = '30min'",
    "wal_buffers = '16MB'",
    "max_connections = 100",
]

PAYOUT_COLUMNS = """id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, table_id int NOT NULL, hand int,
                    player text, amount bigint, fencing_token bigint"""
TABLES = {"none": "p_none", "pg_lease": "p_lease", "plpgsql": "p_plpgsql"}


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def psql(sql, db="bench"):
    return run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(PORT), "-U", "postgres",
                "-d", db, "-At", "-c", sql]).stdout.strip()


def psql_file(script, db="bench"):
    """Runs a multi-statement script, each statement its own transaction."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        return run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(PORT), "-U", "postgres",
                    "-d", db, "-At", "-f", path]).stdout.strip()
    finally:
        os.unlink(path)


def cluster(*args):
    run([str(ROOT / "scripts/cluster.sh"), *args])


def pgbench(script, clients=CLIENTS, seconds=None, transactions=None, mode="prepared", rate=None, db="bench"):
    """Runs one pgbench script; returns (tps, average latency in ms)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
        path = f.name
    cmd = ["pgbench", "-n", "-h", "127.0.0.1", "-p", str(PORT), "-U", "postgres", "-M", mode,
           "-c", str(clients), "-j", str(clients), "-f", path, db]
    cmd += ["-T", str(seconds)] if seconds else ["-t", str(transactions)]
    if rate:
        cmd += ["-R", str(rate)]
    try:
        out = run(cmd).stdout
    except subprocess.CalledProcessError as e:
        sys.exit(f"pgbench failed:\n{e.stdout}\n{e.stderr}\nscript:\n{script}")
    finally:
        os.unlink(path)
    tps = float(re.search(r"tps = ([\d.]+) \(without initial connection time\)", out).group(1))
    lat = float(re.search(r"latency average = ([\d.]+) ms", out).group(1))
    return tps, lat


def reset_payouts():
    """Fresh, empty payout tables for every variant (TRUNCATE of a fenced table is refused)."""
    psql(f"""
        DROP TABLE IF EXISTS p_none, p_lease, p_plpgsql;
        CREATE TABLE p_none ({PAYOUT_COLUMNS});
        CREATE TABLE p_lease ({PAYOUT_COLUMNS});
        CREATE TABLE p_plpgsql ({PAYOUT_COLUMNS});
        SELECT lease.protect('p_lease', '{{table_id}}', 'fencing_token');
        CREATE TRIGGER fence BEFORE INSERT OR UPDATE ON p_plpgsql FOR EACH ROW EXECUTE FUNCTION plpgsql_fence();
        CHECKPOINT;""")


class Workload:
    """Variants measured round-robin; `metric` is 'tps' (higher is better), 'ms' or 'bytes' (lower is better)."""

    def __init__(self, name, metric, variants, baseline, target=None, before=None):
        self.name, self.metric, self.variants, self.baseline = name, metric, variants, baseline
        self.target, self.before = target, before
        self.samples = {v: [] for v in variants}

    def measure(self):
        print(f"-- {self.name}", flush=True)
        for _ in range(RUNS):
            for variant, fn in self.variants.items():
                if self.before:
                    self.before()
                tps, lat = fn()
                self.samples[variant].append(tps if self.metric == "tps" else lat)
        return self

    def median(self, v):
        return statistics.median(self.samples[v])

    def ratio(self, v):
        return self.median(v) / self.median(self.baseline)


def single_row(table, clients=CLIENTS):
    return lambda: pgbench(f"""\\set t random(1, 1000)
INSERT INTO {table} (table_id, hand, player, amount, fencing_token) VALUES (:t, 1, 'ann', 10, 5);
""", clients=clients, seconds=SECONDS)


def bulk(table, resources):
    key = "1" if resources == 1 else f"1 + g % {resources}"
    return lambda: pgbench(f"""INSERT INTO {table} (table_id, hand, player, amount, fencing_token)
SELECT {key}, g, 'ann', g, 5 FROM generate_series(1, 100000) g;
""", clients=1, transactions=3)


def settlement_json():
    rows = ",".join(f'{{"table_id": TABLE, "hand": 1, "player": "p{i}", "amount": {i}}}' for i in range(1, 51))
    return lambda: pgbench(f"""\\set t random(1, 1000)
SELECT lease.fenced_boundary_write('p_lease', 5, replace('[{rows}]', 'TABLE', :t::text)::jsonb);
""", seconds=SECONDS)


def settlement_inserts(table):
    body = "".join(f"INSERT INTO {table} (table_id, hand, player, amount, fencing_token) "
                   f"VALUES (:t, 1, 'p{i}', {i}, 5);\n" for i in range(1, 51))
    return lambda: pgbench(f"\\set t random(1, 1000)\nBEGIN;\n{body}COMMIT;\n", seconds=SECONDS)


def lease_cycle_pg():
    return lambda: pgbench("""\\set n random(1, 1000000)
SELECT token AS tok FROM lease.acquire('cycle:' || :client_id || ':' || :n, 'owner-' || :client_id, 15000) \\gset
SELECT lease.release('cycle:' || :client_id || ':' || :n, 'owner-' || :client_id, :tok);
""", seconds=SECONDS)


def lease_cycle_plpgsql():
    return lambda: pgbench("""\\set n random(1, 1000000)
SELECT pl_acquire('cycle:' || :client_id || ':' || :n, 'owner-' || :client_id, 15000) AS tok \\gset
SELECT pl_release('cycle:' || :client_id || ':' || :n, 'owner-' || :client_id, :tok);
""", seconds=SECONDS)


def renew_pg():
    return lambda: pgbench("""\\set n random(1, 1000)
SELECT lease.renew('renew:' || :client_id || ':' || :n, 'owner-' || :client_id,
                   (SELECT token FROM lease.leases WHERE name = 'renew:' || :client_id || ':' || :n), 86400000);
""", seconds=SECONDS)


def renew_plpgsql():
    return lambda: pgbench("""\\set n random(1, 1000)
SELECT pl_renew('renew:' || :client_id || ':' || :n, 'owner-' || :client_id,
                (SELECT fencing_token FROM leases WHERE name = 'renew:' || :client_id || ':' || :n), 86400000);
""", seconds=SECONDS)


REDIS_CYCLE = ("local ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 15000) "
               "if not ok then return 0 end "
               "local t = redis.call('INCR', KEYS[1] .. ':fence') redis.call('DEL', KEYS[1]) return t")
REDIS_RENEW = ("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], 86400000) end "
               "return 0")


def redis(lua, key, keyspace, requests_per_second_guess=20000):
    def go():
        n = max(1000, requests_per_second_guess * SECONDS)
        out = run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(REDIS_PORT), "-c", str(CLIENTS), "-n", str(n),
                   "-r", str(keyspace), "-q", "EVAL", lua, "1", key, "owner"]).stdout
        tps = float(re.search(r"([\d.]+) requests per second", out).group(1))
        return tps, 1000.0 * CLIENTS / tps
    return go


def renew_all_10k():
    return lambda: pgbench("SELECT count(*) FROM lease.renew_all('big-owner', 600000);\n", clients=1,
                           transactions=20)


HEARTBEAT_SIZES = (10, 1000, 10000)


def beat_sql(fn, leases):
    return f"SELECT count(*) FROM lease.{fn}('hb-{leases}', 600000);"


def beat_time(fn, leases):
    """One heartbeat of an owner holding `leases` leases: average latency, one client."""
    return lambda: pgbench(beat_sql(fn, leases) + "\n", clients=1, transactions=200)


def beat_wal(fn, leases, beats=41):
    """WAL bytes one heartbeat writes (median over `beats` heartbeats, each its own
    transaction): pg_current_wal_insert_lsn() read before and after each."""
    def go():
        lsn = "SELECT pg_current_wal_insert_lsn();"
        script = "\n".join([lsn] + [f"{beat_sql(fn, leases)}\n{lsn}" for _ in range(beats)])
        out = psql_file(script).splitlines()
        marks = out[0::2]
        deltas = [int(psql(f"SELECT pg_wal_lsn_diff('{b}', '{a}')")) for a, b in zip(marks, marks[1:])]
        b = statistics.median(deltas)
        return b, b
    return go


def refusals(audit_on):
    def go():
        psql(f"ALTER SYSTEM SET pg_lease.audit = {'on' if audit_on else 'off'}; ", db="postgres")
        psql("SELECT pg_reload_conf()", db="postgres")
        time.sleep(0.2)
        return pgbench("\\set t random(1, 1000)\nSELECT bench_refuse(:t);\n", clients=2, seconds=SECONDS)
    return go


def accepted_during_flood(flood):
    def go():
        proc = None
        if flood:
            with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
                f.write("\\set t random(1, 1000)\nSELECT bench_refuse(:t);\n")
                path = f.name
            proc = subprocess.Popen(["pgbench", "-n", "-h", "127.0.0.1", "-p", str(PORT), "-U", "postgres",
                                     "-M", "prepared", "-c", "2", "-j", "2", "-R", "2000", "-T", str(SECONDS + 2),
                                     "-f", path, "bench"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
        try:
            return single_row("p_lease", clients=2)()
        finally:
            if proc:
                proc.wait()
                os.unlink(path)
    return go


DDL_TABLES = 100


def ddl_setup():
    """Two databases with the same 100 owner/payout table pairs: fenced with pg_lease, and plain.
    Their catalogs are never analyzed, as in a fresh database (where a costly catalog query gets JIT-compiled)."""
    pairs = f"""
        CREATE TABLE own_' || g || ' (id int PRIMARY KEY, owner_fencing_token bigint);
        CREATE TABLE pay_' || g || ' (id bigint GENERATED ALWAYS AS IDENTITY, table_id int, amount bigint, fencing_token bigint);"""
    for db, fence in (("ddl_guard", True), ("ddl_plain", False)):
        psql(f"CREATE DATABASE {db}", db="postgres")
        if fence:
            psql("CREATE EXTENSION pg_lease", db=db)
        protect = "PERFORM lease.protect('pay_' || g, '{table_id}', 'fencing_token', ('own_' || g)::regclass);" if fence else ""
        psql(f"""DO $$ BEGIN FOR g IN 1..{DDL_TABLES} LOOP
                 EXECUTE '{pairs.strip()}'; {protect} END LOOP; END $$""", db=db)


def ddl(db, statement):
    """One DDL statement per transaction, on a random one of the 100 tables (or a new table)."""
    return lambda: pgbench(f"""\\set n random(1, {DDL_TABLES})
\\set m random(1, 1000000000)
{statement}
""", clients=1, seconds=SECONDS, mode="simple", db=db)


def setup():
    print("Building and installing pg_lease (release)...", flush=True)
    run(["cargo", "pgrx", "install", "--release", "--pg-config", shutil.which("pg_config")], cwd=ROOT)
    cluster("start", "bench", str(PORT), *SETTINGS)
    psql("CREATE DATABASE bench", db="postgres")
    psql("CREATE EXTENSION pg_lease")
    psql((ROOT / "bench/reference.sql").read_text())
    psql("""
        CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint NOT NULL);
        INSERT INTO tables SELECT g, 5 FROM generate_series(1, 1000) g;
        SELECT lease.acquire('big:' || g, 'big-owner', 600000) FROM generate_series(1, 10000) g;
        SELECT lease.acquire('hb-' || n || ':' || g, 'hb-' || n, 600000)
          FROM unnest('{10,1000,10000}'::int[]) n, generate_series(1, n) g;
        SELECT lease.acquire('renew:' || c || ':' || g, 'owner-' || c, 86400000), pl_acquire('renew:' || c || ':' || g, 'owner-' || c, 86400000)
          FROM generate_series(0, 3) c, generate_series(1, 1000) g;
        CREATE FUNCTION bench_refuse(t int) RETURNS void LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO p_lease (table_id, fencing_token) VALUES (t, 4);
        EXCEPTION WHEN SQLSTATE 'LF001' THEN NULL;
        END $$;""")
    reset_payouts()
    ddl_setup()
    server = subprocess.Popen(["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    # The keys renewed below exist, as a game server's leases would.
    run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(REDIS_PORT), "-r", "1000", "-n", "50000", "-q",
         "SET", "renew:__rand_int__", "owner"])
    return server


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = next((l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal")), "0")
    pg = psql("SHOW server_version", db="postgres")
    redis_v = run(["redis-server", "--version"]).stdout.split()[2]
    return (f"{os.cpu_count()} cores ({cpu}), {int(mem) // 1024 // 1024} GiB, Linux {platform.release()}, "
            f"PostgreSQL {pg}, Redis {redis_v.replace('v=', '')}")


UNITS = {"tps": "tx/s", "ms": "ms", "bytes": "bytes"}


def fmt(v, metric):
    return f"{v:,.2f}" if metric == "ms" and v < 10 else f"{v:,.0f}" if metric != "ms" else f"{v:,.1f}"


def report(workloads, seconds_taken, machine_line):
    lines = ["| workload | variant | median | min – max | ratio to baseline | target | met? |",
             "|---|---|---:|---:|---:|---|---|"]
    for w in workloads:
        unit = UNITS[w.metric]
        for v in w.variants:
            s = w.samples[v]
            target, met = "", ""
            if w.target and v == w.target[0]:
                target, check = w.target[1], w.target[2]
                met = "met" if check(w) else "**missed**"
            ratio = "baseline" if v == w.baseline else f"{w.ratio(v):.2f}×"
            lines.append(f"| {w.name} | {v} | {fmt(statistics.median(s), w.metric)} {unit} | "
                         f"{fmt(min(s), w.metric)} – {fmt(max(s), w.metric)} | {ratio} | {target} | {met} |")
    table = "\n".join(lines)
    print("\n" + table + "\n")
    chart(workloads)
    settings = "\n".join(f"- `{s}`" for s in SETTINGS)
    # A hand-written analysis below the marker survives re-runs.
    marker = "<!-- analysis: kept by make bench -->"
    old = (ROOT / "BENCHMARKS.md").read_text() if (ROOT / "BENCHMARKS.md").exists() else ""
    analysis = old[old.index(marker):] if marker in old else marker + "\n"
    (ROOT / "BENCHMARKS.md").write_text(f"""# pg_lease benchmarks

Produced by `make bench` ({RUNS} interleaved runs per variant, {SECONDS} s per throughput run,
{CLIENTS} pgbench clients unless noted, `-M prepared`), in {seconds_taken / 60:.1f} minutes.

**Machine:** {machine_line}.

**Cluster settings** (everything else default; one scratch cluster, `pg_lease` preloaded, audit on):
{settings}

**Variants.** `none`: the payout table without any trigger. `pg_lease`: the table protected with
`lease.protect`. `plpgsql`: `bench/reference.sql`, the PL/pgSQL trigger a competent user would write
(owner row `FOR SHARE`, compare, raise the same SQLSTATE). Leases: `pg_lease` functions vs the
PL/pgSQL lease functions of `bench/reference.sql` (a table plus a token sequence) vs Redis from
Debian on loopback, driven by `redis-benchmark` with the same concurrency; Redis runs
acquire + fence `INCR` + release as one Lua `EVAL` (one round trip), pg_lease and PL/pgSQL as two
statements (acquire, release). Each single-row transaction writes a random table of 1,000;
a 100,000-row INSERT is one transaction (one resource, or 1,000 resources round-robin).
Refusals: `bench_refuse(t)` inserts a stale payout and catches `LF001` (2 clients).
"Accepted during flood": 2 clients of accepted single-row payouts, alone vs while 2 other clients
refuse 2,000 stale writes per second.

For throughput (tx/s) higher is better; for latency (ms) and WAL (bytes) lower is better. Ratios are
variant median / baseline median.

{table}

![pg_lease relative to its baseline per workload](bench/ratios.svg)

{analysis}""")
    print(f"Wrote BENCHMARKS.md and bench/ratios.svg ({seconds_taken / 60:.1f} min)")


def chart(workloads):
    """A bar per workload: pg_lease's median relative to the baseline (1.0 = same)."""
    bars = [(w.name, w.ratio("pg_lease")) for w in workloads if "pg_lease" in w.variants and w.baseline != "pg_lease"]
    width, row, left = 900, 34, 330
    height = 60 + row * len(bars)
    scale = (width - left - 80) / max(2.0, max(r for _, r in bars) * 1.1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="13"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="10" y="22" font-size="15" font-weight="bold">pg_lease median / baseline median '
           f'(tx/s: higher is better; ms: lower is better)</text>']
    for i, (name, r) in enumerate(bars):
        y = 40 + i * row
        out.append(f'<text x="10" y="{y + 18}">{name}</text>')
        out.append(f'<rect x="{left}" y="{y + 4}" width="{r * scale:.1f}" height="{row - 10}" fill="#4a7ab8"/>')
        out.append(f'<text x="{left + r * scale + 6:.1f}" y="{y + 18}">{r:.2f}×</text>')
    x1 = left + scale
    out.append(f'<line x1="{x1:.1f}" y1="36" x2="{x1:.1f}" y2="{height - 10}" stroke="#c33" stroke-dasharray="4"/>')
    out.append("</svg>")
    (ROOT / "bench/ratios.svg").write_text("\n".join(out))


def main():
    started = time.time()
    redis_server = setup()
    try:
        line = machine()
        at = lambda op, bound: (lambda w: op(w.ratio("pg_lease"), bound))
        ge, le, lt = (lambda a, b: a >= b), (lambda a, b: a <= b), (lambda a, b: a < b)
        workloads = [
            Workload("single-row INSERT, synchronous_commit=on", "tps",
                     {v: single_row(t) for v, t in TABLES.items()}, "none",
                     ("pg_lease", "≥ 0.95× none", at(ge, 0.95))).measure(),
        ]
        psql("ALTER SYSTEM SET synchronous_commit = off", db="postgres")
        psql("SELECT pg_reload_conf()", db="postgres")
        workloads.append(Workload("single-row INSERT, synchronous_commit=off", "tps",
                                  {v: single_row(t) for v, t in TABLES.items()}, "none",
                                  ("pg_lease", "≥ 0.90× none", at(ge, 0.90))).measure())
        psql("ALTER SYSTEM RESET synchronous_commit", db="postgres")
        psql("SELECT pg_reload_conf()", db="postgres")
        for resources in (1, 1000):
            w = Workload(f"100,000-row INSERT, {resources} resource{'s' if resources > 1 else ''}", "ms",
                         {v: bulk(t, resources) for v, t in TABLES.items()}, "none",
                         ("pg_lease", "≤ 1.25× none and ≥ 3× faster than plpgsql",
                          lambda w: w.ratio("pg_lease") <= 1.25 and w.median("plpgsql") >= 3 * w.median("pg_lease")),
                         before=reset_payouts)
            workloads.append(w.measure())
        workloads.append(Workload("50-row hand settlement", "tps", {
            "50 INSERTs, none": settlement_inserts("p_none"),
            "pg_lease": settlement_json(),
            "50 INSERTs, pg_lease": settlement_inserts("p_lease"),
            "plpgsql": settlement_inserts("p_plpgsql"),
        }, "50 INSERTs, none").measure())
        workloads.append(Workload("lease acquire + release", "tps", {
            "plpgsql": lease_cycle_plpgsql(), "pg_lease": lease_cycle_pg(), "redis": redis(REDIS_CYCLE, "cycle:__rand_int__", 1000000),
        }, "plpgsql", ("pg_lease", "≥ 1.5× plpgsql", at(ge, 1.5))).measure())
        workloads.append(Workload("lease renew", "tps", {
            "plpgsql": renew_plpgsql(), "pg_lease": renew_pg(), "redis": redis(REDIS_RENEW, "renew:__rand_int__", 1000),
        }, "plpgsql", ("pg_lease", "≥ 1.5× plpgsql", at(ge, 1.5))).measure())
        w = Workload("renew_all, 10,000 leases", "ms", {"pg_lease": renew_all_10k()}, "pg_lease",
                     ("pg_lease", "< 50 ms", lambda w: w.median("pg_lease") < 50)).measure()
        workloads.append(w)
        sizes = {f"{n:,} leases": n for n in HEARTBEAT_SIZES}
        flat = lambda w: (w.median("10,000 leases") <= 2 and w.median("10,000 leases") <= 1.25 * w.median("10 leases"))
        workloads.append(Workload("lease.heartbeat, one owner", "ms",
                                  {k: beat_time("heartbeat", n) for k, n in sizes.items()}, "10 leases",
                                  ("10,000 leases", "≤ 2 ms, flat (≤ 1.25× 10 leases)", flat)).measure())
        workloads.append(Workload("lease.heartbeat, one owner: WAL per heartbeat", "bytes",
                                  {k: beat_wal("heartbeat", n) for k, n in sizes.items()}, "10 leases",
                                  ("10,000 leases", "≤ 1 KB, flat",
                                   lambda w: w.median("10,000 leases") <= 1024
                                   and w.median("10,000 leases") <= w.median("10 leases") + 64)).measure())
        workloads.append(Workload("lease.renew_all (lists every lease), one owner", "ms",
                                  {k: beat_time("renew_all", n) for k, n in sizes.items()}, "10 leases").measure())
        workloads.append(Workload("lease.renew_all, one owner: WAL per heartbeat", "bytes",
                                  {k: beat_wal("renew_all", n) for k, n in sizes.items()}, "10 leases",
                                  ("10,000 leases", "≤ 1 KB", lambda w: w.median("10,000 leases") <= 1024)).measure())
        workloads.append(Workload("refusals per second", "tps", {
            "audit off": refusals(False), "audit on": refusals(True)}, "audit off").measure())
        workloads.append(Workload("accepted writes during a refusal flood", "tps", {
            "alone": accepted_during_flood(False), "during flood": accepted_during_flood(True),
        }, "alone", ("during flood", "≥ 0.90× alone", lambda w: w.ratio("during flood") >= 0.90)).measure())
        for what, statement in (
            ("CREATE TABLE", "CREATE TABLE IF NOT EXISTS new_:m (id int PRIMARY KEY, v text);"),
            ("ALTER TABLE ADD COLUMN on a fenced table", "ALTER TABLE pay_:n ADD COLUMN IF NOT EXISTS c_:m int;"),
            ("CREATE INDEX on a fenced table", "CREATE INDEX ON pay_:n (amount);"),
        ):
            workloads.append(Workload(
                f"DDL guard: {what} ({DDL_TABLES} protected tables), per statement", "ms",
                {"no pg_lease": ddl("ddl_plain", statement), "pg_lease": ddl("ddl_guard", statement)}, "no pg_lease",
                ("pg_lease", "guard adds < 5 ms", lambda w: w.median("pg_lease") - w.median("no pg_lease") < 5)).measure())
        workloads = [w for w in workloads if w is not None]
        report(workloads, time.time() - started, line)
    finally:
        redis_server.terminate()
        cluster("stop", "bench")


if __name__ == "__main__":
    main()
