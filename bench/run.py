#!/usr/bin/env python3
"""`make bench`: pg_lease measured side by side against what users would use instead.

Starts a scratch cluster with fixed settings, runs every workload with pgbench
custom scripts (-M prepared), interleaves the variants (A B C, B C A, ...) for
BENCH_RUNS rounds, and prints one Markdown table of medians, min-max and ratios
(the median of per-round ratios).
The same table, the machine and the settings go to BENCHMARKS.md, with a chart
of pg_lease's ratio to the baseline per workload in bench/ratios.svg.

Environment: BENCH_RUNS (rounds, default 5), BENCH_SECONDS (per throughput run,
default 5), BENCH_PORT (PostgreSQL's port, default 54450; Redis takes the next
one, the Citus row's coordinator and two workers the three after it, the
logical replication row's publisher and subscriber the two after those), PG_CONFIG
(the PostgreSQL to build against and run: its bindir's
initdb/postgres/psql/pgbench; default the pg_config on PATH).

`bench/run.py citus` runs only the Citus row (on its own cluster, built by
scripts/citus.sh) and prints it, leaving BENCHMARKS.md as it is;
`bench/run.py replication` does the same for the logical replication row.
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
# The Citus row's coordinator, then its two workers.
CITUS_PORTS = [PORT + 2, PORT + 3, PORT + 4]
# The logical replication row's publisher and subscriber.
REPLICATION_PORTS = [PORT + 5, PORT + 6]
RUNS = int(os.environ.get("BENCH_RUNS", "5"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "5"))
# The DDL guard's rows are per-statement latencies of thousands of statements per
# run: three rounds are plenty, and keep `make bench` within its 20 minutes.
DDL_RUNS = min(RUNS, 3)
# The commit-bound rows swing most with this VM's disk: two more rounds.
COMMIT_RUNS = RUNS + 2
CLIENTS = 4
HOT_CLIENTS = 8
PG_CONFIG = os.environ.get("PG_CONFIG") or shutil.which("pg_config") or sys.exit(
    "bench: no pg_config on PATH: set PG_CONFIG to PostgreSQL 15's (scripts/pg.sh pg_config prints it)")
BIN = subprocess.run([PG_CONFIG, "--bindir"], check=True, text=True, capture_output=True).stdout.strip()
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


def pg_env(**extra):
    """The environment for PostgreSQL's tools: PG_CONFIG for scripts/cluster.sh, plus `extra`."""
    return {**os.environ, "PG_CONFIG": PG_CONFIG, **extra}


def psql(sql, db="bench", port=PORT):
    return run([f"{BIN}/psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                "-d", db, "-At", "-c", sql]).stdout.strip()


def psql_file(script, db="bench", port=PORT):
    """Runs a multi-statement script, each statement its own transaction."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        return run([f"{BIN}/psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                    "-d", db, "-At", "-f", path]).stdout.strip()
    finally:
        os.unlink(path)


def cluster(*args):
    run([str(ROOT / "scripts/cluster.sh"), *args], env=pg_env())


def pgbench(script, clients=CLIENTS, seconds=None, transactions=None, mode="prepared", rate=None, db="bench",
            options=None, port=PORT):
    """Runs one pgbench script; returns (tps, average latency in ms)."""
    return pgbench_counted(script, clients, seconds, transactions, mode, rate, db, options, port)[:2]


def pgbench_counted(script, clients=CLIENTS, seconds=None, transactions=None, mode="prepared", rate=None, db="bench",
                    options=None, port=PORT):
    """Runs one pgbench script (against the server on `port`), its sessions with
    PGOPTIONS=`options` if given; returns (tps, average latency in ms, transactions processed)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
        path = f.name
    cmd = [f"{BIN}/pgbench", "-n", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-M", mode,
           "-c", str(clients), "-j", str(clients), "-f", path, db]
    cmd += ["-T", str(seconds)] if seconds else ["-t", str(transactions)]
    if rate:
        cmd += ["-R", str(rate)]
    try:
        out = run(cmd, env=pg_env(PGOPTIONS=options) if options else None).stdout
    except subprocess.CalledProcessError as e:
        sys.exit(f"pgbench failed:\n{e.stdout}\n{e.stderr}\nscript:\n{script}")
    finally:
        os.unlink(path)
    tps = float(re.search(r"tps = ([\d.]+) \(without initial connection time\)", out).group(1))
    lat = float(re.search(r"latency average = ([\d.]+) ms", out).group(1))
    done = int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))
    return tps, lat, done


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
    """Variants measured round-robin; `metric` is 'tps' (higher is better), 'ms' or 'bytes' (lower is better),
    or one of the counts of a derived row ('per1k', 'pages').

    `target` is (variant, text, check). `subject` is the variant charted against the baseline
    (pg_lease's). `divisor`: ratios are to the baseline's result of the same round divided by it (2: a lease
    cycle is two commits against the floor's one), with `baseline_note` saying so in the table.
    A variant's function returns (tps, latency) or (tps, latency, {extra: value}); each extra
    becomes a row of its own through `derived`."""

    def __init__(self, name, metric, variants, baseline, target=None, before=None, subject="pg_lease",
                 divisor=1, baseline_note="baseline", runs=None):
        self.name, self.metric, self.variants, self.baseline = name, metric, variants, baseline
        self.target, self.before, self.subject = target, before, subject
        self.divisor, self.baseline_note, self.runs = divisor, baseline_note, runs or RUNS
        self.samples = {v: [] for v in variants}
        self.extras = {}
        self.ratios = self.charted = True

    def measure(self):
        print(f"-- {self.name}", flush=True)
        started = time.time()
        names = list(self.variants)
        for r in range(self.runs):
            # Each round starts one variant later (A B C, B C A, C A B, ...), so that no
            # variant always runs right after the same neighbour or first in a round.
            for variant in names[r % len(names):] + names[:r % len(names)]:
                fn = self.variants[variant]
                if self.before:
                    self.before()
                tps, lat, *extra = fn()
                self.samples[variant].append(tps if self.metric == "tps" else lat)
                for key, value in (extra[0] if extra else {}).items():
                    self.extras.setdefault(key, {v: [] for v in self.variants})[variant].append(value)
        print(f"   {time.time() - started:.0f} s", flush=True)
        return self

    def derived(self, key, name, metric):
        """The extra `key` every variant reported, as rows of their own (no ratios, not charted)."""
        w = Workload(name, metric, self.variants, self.baseline)
        w.samples, w.ratios, w.charted = self.extras[key], False, False
        return w

    def median(self, v):
        return statistics.median(self.samples[v])

    def round_ratios(self, v):
        """Variant / baseline within each round (× the divisor): the two were measured
        minutes apart at most, so a drift of the machine (this VM's fsync rate moves by
        a factor of 3 within one invocation) moves both."""
        return [x / (b / self.divisor) for x, b in zip(self.samples[v], self.samples[self.baseline])]

    def ratio(self, v):
        """The median of the per-round ratios."""
        return statistics.median(self.round_ratios(v))


# Targets: `at(ge, 0.95)` checks pg_lease's ratio to the baseline.
at = lambda op, bound: (lambda w: op(w.ratio("pg_lease"), bound))
ge, le, lt = (lambda a, b: a >= b), (lambda a, b: a <= b), (lambda a, b: a < b)


def single_row(table, clients=CLIENTS, db="bench", port=PORT):
    return lambda: pgbench(f"""\\set t random(1, 1000)
INSERT INTO {table} (table_id, hand, player, amount, fencing_token) VALUES (:t, 1, 'ann', 10, 5);
""", clients=clients, seconds=SECONDS, db=db, port=port)


def bulk(table, resources):
    key = "1" if resources == 1 else f"1 + g % {resources}"
    return lambda: pgbench(f"""INSERT INTO {table} (table_id, hand, player, amount, fencing_token)
SELECT {key}, g, 'ann', g, 5 FROM generate_series(1, 100000) g;
""", clients=1, transactions=3)


def settlement_json(clients=CLIENTS):
    rows = ",".join(f'{{"table_id": TABLE, "hand": 1, "player": "p{i}", "amount": {i}}}' for i in range(1, 51))
    return lambda: pgbench(f"""\\set t random(1, 1000)
SELECT lease.fenced_boundary_write('p_lease', 5, replace('[{rows}]', 'TABLE', :t::text)::jsonb);
""", clients=clients, seconds=SECONDS)


def settlement_inserts(table, clients=CLIENTS):
    body = "".join(f"INSERT INTO {table} (table_id, hand, player, amount, fencing_token) "
                   f"VALUES (:t, 1, 'p{i}', {i}, 5);\n" for i in range(1, 51))
    return lambda: pgbench(f"\\set t random(1, 1000)\nBEGIN;\n{body}COMMIT;\n", clients=clients, seconds=SECONDS)


FLOOR_ROWS = 1000


def floor_update():
    """The commit floor: a one-row UPDATE of a random row of t, one commit per transaction."""
    return lambda: pgbench(f"""\\set i random(1, {FLOOR_ROWS})
UPDATE t SET n = n + 1 WHERE id = :i;
""", seconds=SECONDS)


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


def lease_cycle_minimal():
    """The least a cycle writes in SQL (bench/reference.sql's min_leases): upsert, then release."""
    return lambda: pgbench("""\\set n random(1, 1000000)
INSERT INTO min_leases VALUES ('cycle:' || :client_id || ':' || :n, 'owner-' || :client_id, nextval('min_tokens'), false)
    ON CONFLICT (name) DO UPDATE SET owner_id = excluded.owner_id, fencing_token = excluded.fencing_token,
                                     released = false
    RETURNING fencing_token AS tok \\gset
UPDATE min_leases SET released = true WHERE name = 'cycle:' || :client_id || ':' || :n AND fencing_token = :tok;
""", seconds=SECONDS)


def per_client(tokens):
    """pgbench meta-commands that give each client its own lease's token as :tok (client-side, unmeasured)."""
    lines = [f"\\{'if' if c == 0 else 'elif'} :client_id = {c}\n\\set tok {t}" for c, t in enumerate(tokens)]
    return "\n".join(lines) + "\n\\endif\n"


def renew_known_token(call, token_query):
    """Each client renews its own lease ('renew:<client>'), whose token it holds, as a game
    server does: the token is read once before the run, outside the measured transactions."""
    def go():
        tokens = psql(token_query).split()
        if len(tokens) != CLIENTS:
            sys.exit(f"bench: expected {CLIENTS} renew leases, found {len(tokens)}: {token_query}")
        return pgbench(per_client(tokens) + f"SELECT {call}('renew:' || :client_id, 'owner-' || :client_id, :tok, 86400000);\n",
                       seconds=SECONDS)
    return go


def renew_pg():
    return renew_known_token("lease.renew", "SELECT token FROM lease.leases WHERE name ~ '^renew:[0-9]+$' ORDER BY name")


def renew_plpgsql():
    return renew_known_token("pl_renew", "SELECT fencing_token FROM leases WHERE name ~ '^renew:[0-9]+$' ORDER BY name")


HOT_RESOURCE = 1


def multixact_counters():
    """(next MultiXactId, MultiXactOffset and MultiXactMember SLRU pages zeroed, pages written).
    mxid_age(m) is next MultiXactId - m, read live from shared memory, so mxid_age('1') + 1 is the
    next MultiXactId exactly (pg_control_checkpoint() has it only as of the last checkpoint)."""
    row = psql("""SELECT mxid_age('1'::xid) + 1,
                         sum(blks_zeroed) FILTER (WHERE name = 'MultiXactOffset'),
                         sum(blks_zeroed) FILTER (WHERE name = 'MultiXactMember'),
                         sum(blks_written) FILTER (WHERE name IN ('MultiXactOffset', 'MultiXactMember'))
                    FROM pg_stat_slru""")
    return [int(x) for x in row.split("|")]


def sessions_gone():
    """Waits until pgbench's sessions have left: a backend reports its SLRU counters when it exits."""
    for _ in range(100):
        if psql("SELECT count(*) FROM pg_stat_activity WHERE datname = 'bench' AND backend_type = 'client backend' "
                "AND pid <> pg_backend_pid()") == "0":
            return
        time.sleep(0.05)
    sys.exit("bench: pgbench's sessions did not exit within 5 s")


def hot_owner(table):
    """HOT_CLIENTS sessions inserting payouts of one resource, synchronous_commit=off for their
    sessions only (PGOPTIONS); the MultiXacts the cluster assigned and the MultiXact SLRU pages
    it zeroed and wrote over the run come back as extras."""
    script = (f"INSERT INTO {table} (table_id, hand, player, amount, fencing_token) "
              f"VALUES ({HOT_RESOURCE}, 1, 'ann', 10, 5);\n")

    def go():
        before = multixact_counters()
        tps, lat, done = pgbench_counted(script, clients=HOT_CLIENTS, seconds=SECONDS,
                                         options="-c synchronous_commit=off")
        sessions_gone()
        multis, offsets, members, written = (a - b for a, b in zip(multixact_counters(), before))
        return tps, lat, {"multis": 1000.0 * multis / done, "offsets": offsets, "members": members,
                          "written": written}
    return go


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
        pairs = ", ".join(f"('{a}'::pg_lsn, '{b}'::pg_lsn)" for a, b in zip(marks, marks[1:]))
        deltas = [int(d) for d in psql(f"SELECT pg_wal_lsn_diff(b, a) FROM (VALUES {pairs}) v(a, b)").split()]
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
            proc = subprocess.Popen([f"{BIN}/pgbench", "-n", "-h", "127.0.0.1", "-p", str(PORT), "-U", "postgres",
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
    run(["cargo", "pgrx", "install", "--release", "--pg-config", PG_CONFIG], cwd=ROOT)
    cluster("start", "bench", str(PORT), *SETTINGS)
    psql("CREATE DATABASE bench", db="postgres")
    psql("CREATE EXTENSION pg_lease")
    psql((ROOT / "bench/reference.sql").read_text())
    psql(f"""
        CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint NOT NULL);
        INSERT INTO tables SELECT g, 5 FROM generate_series(1, 1000) g;
        SELECT lease.acquire('big:' || g, 'big-owner', 600000) FROM generate_series(1, 10000) g;
        SELECT lease.acquire('hb-' || n || ':' || g, 'hb-' || n, 600000)
          FROM unnest('{{10,1000,10000}}'::int[]) n, generate_series(1, n) g;
        SELECT lease.acquire('renew:' || c, 'owner-' || c, 86400000), pl_acquire('renew:' || c, 'owner-' || c, 86400000)
          FROM generate_series(0, {CLIENTS - 1}) c;
        CREATE TABLE t (id int PRIMARY KEY, n bigint NOT NULL);
        INSERT INTO t SELECT g, 0 FROM generate_series(1, {FLOOR_ROWS}) g;
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


CITUS_NODES = ["bench_citus_coord", "bench_citus_w1", "bench_citus_w2"]
# Citus's own needs on top of the bench's settings; three servers share the
# machine, so a smaller buffer pool each.
CITUS_SETTINGS = SETTINGS + [
    "shared_preload_libraries = 'citus,pg_lease'",
    "shared_buffers = '256MB'",
    "max_prepared_transactions = 100",
    "citus.node_conninfo = 'sslmode=disable'",
]


def citus_row():
    """Single-row INSERTs through a Citus coordinator into payouts distributed by
    table_id over two workers: fenced (co-located owner table) against unfenced,
    on the same cluster, interleaved. Starts and stops its own three servers.
    None (the row is left out, with the reason printed) where Citus 13.2.2 does not
    support the PostgreSQL."""
    supports = subprocess.run([str(ROOT / "scripts/citus.sh"), "supports"], env=pg_env(), text=True,
                              capture_output=True)
    if supports.returncode == 3:
        print(f"-- Citus row left out: {supports.stdout.strip()}", flush=True)
        return None
    run([str(ROOT / "scripts/citus.sh"), "install"], env=pg_env())
    coordinator, *workers = CITUS_PORTS
    try:
        for name, port in zip(CITUS_NODES, CITUS_PORTS):
            cluster("start", name, str(port), *CITUS_SETTINGS)
            psql("CREATE EXTENSION citus", db="postgres", port=port)
        psql(f"SELECT citus_set_coordinator_host('127.0.0.1', {coordinator})", db="postgres", port=coordinator)
        for port in workers:
            psql(f"SELECT citus_add_node('127.0.0.1', {port})", db="postgres", port=coordinator)
        psql_file(f"""
            CREATE EXTENSION pg_lease;
            CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint NOT NULL);
            SELECT create_distributed_table('tables', 'id');
            INSERT INTO tables SELECT g, 5 FROM generate_series(1, 1000) g;
            CREATE TABLE cp_none ({CITUS_PAYOUT_COLUMNS});
            CREATE TABLE cp_lease ({CITUS_PAYOUT_COLUMNS});
            SELECT create_distributed_table('cp_none', 'table_id', colocate_with => 'tables');
            SELECT create_distributed_table('cp_lease', 'table_id', colocate_with => 'tables');
            SELECT lease.protect('cp_lease', '{{table_id}}', 'fencing_token');
            CHECKPOINT;""", db="postgres", port=coordinator)
        for port in workers:
            psql("CHECKPOINT", db="postgres", port=port)
        return Workload("Citus: single-row INSERT through the coordinator, 2 workers", "tps",
                        {v: single_row(t, db="postgres", port=coordinator)
                         for v, t in (("none", "cp_none"), ("pg_lease", "cp_lease"))}, "none",
                        ("pg_lease", "≥ 0.95× none", at(ge, 0.95))).measure()
    finally:
        for name in CITUS_NODES:
            cluster("stop", name)


REPLICATION_NODES = ["bench_pub", "bench_sub"]
REPLICATION_ROWS = 100_000


def replication_row():
    """A subscriber applying a publisher's payout stream: 100,000 payout rows of
    1,000 resources committed in one publisher transaction, timed from the commit
    until the subscriber has applied them (a mark committed after them is there),
    into a table the subscriber protects (the trusted path: the row is not judged,
    its owner row is raised if it is behind, fence::owner::catch_up) against one it
    does not; both tables are protected on the publisher. Starts and stops its own
    two servers."""
    publisher, subscriber = REPLICATION_PORTS
    try:
        cluster("start", REPLICATION_NODES[0], str(publisher), *SETTINGS, "wal_level = logical")
        cluster("start", REPLICATION_NODES[1], str(subscriber), *SETTINGS)
        schema = f"""
            CREATE EXTENSION pg_lease;
            CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint NOT NULL);
            CREATE TABLE r_none ({PAYOUT_COLUMNS});
            CREATE TABLE r_lease ({PAYOUT_COLUMNS});
            CREATE TABLE marks (n int PRIMARY KEY);
            SELECT lease.protect('r_lease', '{{table_id}}', 'fencing_token');"""
        psql_file(schema + """
            SELECT lease.protect('r_none', '{table_id}', 'fencing_token');
            INSERT INTO tables SELECT g, 5 FROM generate_series(1, 1000) g;
            CREATE PUBLICATION bench FOR TABLE tables, r_none, r_lease, marks;""", db="postgres", port=publisher)
        psql_file(schema + f"""
            CREATE SUBSCRIPTION bench CONNECTION 'host=127.0.0.1 port={publisher} user=postgres dbname=postgres'
              PUBLICATION bench;""", db="postgres", port=subscriber)
        wait_applied = """DO $$ BEGIN
            WHILE NOT EXISTS (SELECT FROM pg_subscription_rel WHERE srsubstate = 'r' HAVING count(*) = 4) LOOP
                PERFORM pg_sleep(0.05);
            END LOOP; END $$;"""
        psql(wait_applied, db="postgres", port=subscriber)
        marks = iter(range(1, 1_000_000))

        def applied(table):
            def run_once():
                psql(f"""INSERT INTO {table} (table_id, hand, player, amount, fencing_token)
                         SELECT 1 + g % 1000, g, 'ann', g, 5 FROM generate_series(1, {REPLICATION_ROWS}) g""",
                     db="postgres", port=publisher)
                mark = next(marks)
                started = time.time()
                psql(f"INSERT INTO marks VALUES ({mark})", db="postgres", port=publisher)
                psql(f"""DO $$ BEGIN
                    WHILE NOT EXISTS (SELECT FROM marks WHERE n = {mark}) LOOP PERFORM pg_sleep(0.002); END LOOP;
                    END $$;""", db="postgres", port=subscriber)
                return None, (time.time() - started) * 1000
            return run_once

        return Workload(f"logical replication: subscriber applies {REPLICATION_ROWS:,} payout rows of 1,000 "
                        "resources", "ms", {"none": applied("r_none"), "pg_lease": applied("r_lease")}, "none",
                        ("pg_lease", "≤ 1.15× none", at(le, 1.15)), runs=2 * RUNS).measure()
    finally:
        for name in REPLICATION_NODES:
            cluster("stop", name)


# A distributed table's unique constraints must include its distribution column:
# the payout rows have no key of their own here.
CITUS_PAYOUT_COLUMNS = "table_id int NOT NULL, hand int, player text, amount bigint, fencing_token bigint"


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = next((l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal")), "0")
    pg = psql("SHOW server_version", db="postgres")
    redis_v = run(["redis-server", "--version"]).stdout.split()[2]
    return (f"{os.cpu_count()} cores ({cpu}), {int(mem) // 1024 // 1024} GiB, Linux {platform.release()}, "
            f"PostgreSQL {pg}, Redis {redis_v.replace('v=', '')}")


UNITS = {"tps": "tx/s", "ms": "ms", "bytes": "bytes", "per1k": "per 1,000 tx", "pages": "pages"}


def fmt(v, metric):
    if metric in ("ms", "per1k"):
        return f"{v:,.2f}" if v < 10 else f"{v:,.1f}"
    return f"{v:,.0f}"


def report(workloads, seconds_taken, machine_line):
    lines = ["| workload | variant | median | min – max | ratio to baseline | per-round ratios | target | met? |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for w in workloads:
        unit = UNITS[w.metric]
        for v in w.variants:
            s = w.samples[v]
            target, met = "", ""
            if w.target and v == w.target[0]:
                target, check = w.target[1], w.target[2]
                met = "met" if check(w) else "**missed**"
            ratio = "—" if not w.ratios else w.baseline_note if v == w.baseline else f"{w.ratio(v):.2f}×"
            spread = ""
            if w.ratios and v != w.baseline:
                rr = w.round_ratios(v)
                spread = f"{min(rr):.2f} – {max(rr):.2f}"
            lines.append(f"| {w.name} | {v} | {fmt(statistics.median(s), w.metric)} {unit} | "
                         f"{fmt(min(s), w.metric)} – {fmt(max(s), w.metric)} | {ratio} | {spread} | {target} | {met} |")
    table = "\n".join(lines)
    print("\n" + table + "\n")
    chart(workloads)
    settings = "\n".join(f"- `{s}`" for s in SETTINGS)
    # A hand-written analysis below the marker survives re-runs.
    marker = "<!-- analysis: kept by make bench -->"
    old = (ROOT / "BENCHMARKS.md").read_text() if (ROOT / "BENCHMARKS.md").exists() else ""
    analysis = old[old.index(marker):] if marker in old else marker + "\n"
    (ROOT / "BENCHMARKS.md").write_text(f"""# pg_lease benchmarks

Produced by `make bench` ({RUNS} interleaved runs per variant, {COMMIT_RUNS} for the commit-bound
rows, {DDL_RUNS} for the DDL guard's rows,
{SECONDS} s per throughput run, {CLIENTS} pgbench clients unless noted, `-M prepared`), in
{seconds_taken / 60:.1f} minutes. Every ratio compares variants measured in turn, round by round,
in the same invocation.

**Machine:** {machine_line}.

**Cluster settings** (everything else default; one scratch cluster, `pg_lease` preloaded, audit on):
{settings}

**Variants.** `none`: the payout table without any trigger. `pg_lease`: the table protected with
`lease.protect`. `plpgsql`: `bench/reference.sql`, the PL/pgSQL trigger a competent user would write
(owner row `FOR SHARE`, compare, raise the same SQLSTATE). Each single-row transaction writes a
random table of 1,000; a 100,000-row INSERT is one transaction (one resource, or 1,000 resources
round-robin).

**Hand settlement.** 50 payout rows of one random table in one transaction: one
`lease.fenced_boundary_write` call (`fenced_boundary_write`) against 50 INSERTs into the fenced
table between `BEGIN` and `COMMIT` (the baseline), with 4 clients (the CPU saturated; target) and 2;
the 50 INSERTs into the table without a trigger and with the PL/pgSQL fence are context.

**Leases against the commit floor.** The floor is what any one-row commit costs here: table
`t (id int PRIMARY KEY, n bigint)` of {FLOOR_ROWS:,} rows, `UPDATE t SET n = n + 1 WHERE id = :i` with
a random `i`, {CLIENTS} clients, `synchronous_commit = on`; its tx/s are the `floor` rows. It is
measured again, interleaved, in both lease workloads. renew: each client renews its own lease
(`renew:<client>`) with the token it holds, read once before the run by the driver and given to
pgbench as a client-side variable (a `\\if :client_id` chain), so the measured transaction is the
renew call alone, as the floor's is the UPDATE alone (0.5.0's workload looked the token up in a
subquery of the measured statement; renew now rewrites one row per client, where the floor's UPDATEs
spread over {FLOOR_ROWS:,} rows, all of them in shared buffers). Target: renew ≥ 0.90× the floor. acquire + release: a cycle
(acquire of a random name of 1,000,000 per client, release with the returned token, each its own
transaction) is two commits, so its ratio is to half the floor's tx/s: cycles/s ÷ (floor ÷ 2), target
≥ 0.90. The PL/pgSQL lease functions of `bench/reference.sql` (a table plus a token sequence) and
Redis from Debian on loopback, driven by `redis-benchmark` with the same concurrency, are context
with no target: Redis runs acquire + fence `INCR` + release as one Lua `EVAL` (one round trip) and
renews a random one of 1,000 keys. `minimal SQL` (context) is the least a lease store on Postgres
writes for a cycle, with no checks at all: the acquire an upsert of the name's row with a token
from a sequence, the release an UPDATE marking it released (`min_leases` in `bench/reference.sql`).
Both lease workloads run again with `synchronous_commit = off`
(CPU-bound; context, no target; no Redis): there the floor's commits do not wait for the disk,
while every acquire still does (pg_lease forces its commit synchronous: the token must be durable
before it is used).

**Hot owner.** {HOT_CLIENTS} pgbench clients all insert payouts of the same table (one resource, so
one owner row that every fenced writer locks `FOR SHARE`), with `synchronous_commit = off` in
their sessions only (`PGOPTIONS`): CPU-bound, the most lockers overlapping. Concurrent share
lockers of a row make PostgreSQL create a MultiXact for them, and a new one each time the set of
lockers changes, which fills the MultiXact SLRUs (`pg_multixact/offsets` and `members`) and
eventually forces anti-wraparound vacuums. Reported per variant, over each run: **MultiXacts per
1,000 transactions**, from the next MultiXactId before and after the run: `mxid_age('1')` is the
server's live next MultiXactId minus 1, so the difference is exactly the number of MultiXactIds
assigned in the cluster during the run (nothing else runs; `pg_control_checkpoint()` would give
the counter only as of the last checkpoint); **pages zeroed** in `pg_stat_slru` for
`MultiXactOffset` (a page holds 2,048 MultiXacts) and `MultiXactMember` (a page holds 1,636
members): each zeroed page is a new 8 kB page of the SLRU, read after pgbench's sessions have
exited (a backend reports its SLRU counters when it exits); and **pages written** during the
run (evicted from the SLRUs' few buffers; pages still dirty in them are written by the next
checkpoint, after the run, and are not in it).
Target: fenced ≥ 0.90× no trigger.

**Other rows.** Refusals: `bench_refuse(t)` inserts a stale payout and catches `LF001` (2 clients).
"Accepted during flood": 2 clients of accepted single-row payouts, alone vs while 2 other clients
refuse 2,000 stale writes per second. Citus: a coordinator and two workers of their own (Citus 13.2.2,
the same settings but `shared_buffers = '256MB'` each), `tables` (1,000 rows) distributed by `id`,
the payout tables distributed by `table_id` co-located with it (32 shards), single-row INSERTs
through the coordinator, fenced against unfenced, interleaved; target ≥ 0.95. Logical replication: a
publisher and a subscriber of their own (the same settings, the publisher with `wal_level = logical`);
{REPLICATION_ROWS:,} payout rows of 1,000 resources committed in one publisher transaction, timed from its
commit until the subscriber has a mark committed after it, into a table the subscriber protects (the
trusted path: rows not judged, owner rows behind them raised) against one it does not, both
protected on the publisher; {2 * RUNS} rounds; target ≤ 1.15× (as for a 100,000-row INSERT). DDL guard: one client, one statement per transaction, on a
random one of 100 protected tables, in databases whose catalogs were never analyzed.

For throughput (tx/s) higher is better; for latency (ms), WAL (bytes) and MultiXact counts lower is
better. A ratio is the median, over the rounds, of the variant's result divided by the baseline's
in the same round (÷ 2 where the table says so); "per-round ratios" gives their range. Each round
starts one variant later than the one before (A B C, B C A, ...). Per-round ratios, not a ratio of
medians: this VM's fsync rate drifts by a factor of three within one invocation, and a variant and
its baseline measured in the same round see the same disk. The commit-bound rows (single-row
INSERT with `synchronous_commit=on`, renew, acquire + release) run {COMMIT_RUNS} rounds. The
hot-owner count rows have no ratio (no trigger creates no MultiXacts).

{table}

![pg_lease relative to its baseline per workload](bench/ratios.svg)

{analysis}""")
    print(f"Wrote BENCHMARKS.md and bench/ratios.svg ({seconds_taken / 60:.1f} min)")


def chart(workloads):
    """A bar per workload: its subject's (pg_lease's) ratio to the baseline (1.0 = same)."""
    bars = [(w.name, w.ratio(w.subject)) for w in workloads
            if w.charted and w.subject in w.variants and w.baseline != w.subject]
    # Labels at about 7 px a character (13 px sans-serif) to the left of the bars.
    row, left = 34, max(330, 7 * max(len(name) for name, _ in bars) + 20)
    width = left + 570
    height = 60 + row * len(bars)
    scale = (width - left - 80) / max(2.0, max(r for _, r in bars) * 1.1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="13"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="10" y="22" font-size="15" font-weight="bold">pg_lease / baseline, median of per-round ratios '
           f'(tx/s: higher is better; ms: lower is better; lease rows: to the commit floor)</text>']
    for i, (name, r) in enumerate(bars):
        y = 40 + i * row
        out.append(f'<text x="10" y="{y + 18}">{name}</text>')
        out.append(f'<rect x="{left}" y="{y + 4}" width="{r * scale:.1f}" height="{row - 10}" fill="#4a7ab8"/>')
        out.append(f'<text x="{left + r * scale + 6:.1f}" y="{y + 18}">{r:.2f}×</text>')
    x1 = left + scale
    out.append(f'<line x1="{x1:.1f}" y1="36" x2="{x1:.1f}" y2="{height - 10}" stroke="#c33" stroke-dasharray="4"/>')
    out.append("</svg>")
    (ROOT / "bench/ratios.svg").write_text("\n".join(out))


ONLY = {"citus": citus_row, "replication": replication_row}


def only(row):
    """`bench/run.py citus|replication`: that row alone, printed (BENCHMARKS.md is not rewritten)."""
    print("Building and installing pg_lease (release)...", flush=True)
    run(["cargo", "pgrx", "install", "--release", "--pg-config", PG_CONFIG], cwd=ROOT)
    w = ONLY[row]()
    if w is None:
        return
    unit = UNITS[w.metric]
    rr = w.round_ratios("pg_lease")
    print(f"{w.name}: " + ", ".join(f"{v} median {fmt(w.median(v), w.metric)} {unit} (min "
                                    f"{fmt(min(w.samples[v]), w.metric)}, max {fmt(max(w.samples[v]), w.metric)})"
                                    for v in w.variants)
          + f"; pg_lease / none = {w.ratio('pg_lease'):.3f} (per round {min(rr):.2f} – {max(rr):.2f}; target "
          f"{w.target[1]}: {'met' if w.target[2](w) else 'missed'})")


def main():
    if len(sys.argv) == 2 and sys.argv[1] in ONLY:
        return only(sys.argv[1])
    if sys.argv[1:]:
        sys.exit(f"usage: {sys.argv[0]} [{'|'.join(ONLY)}]")
    started = time.time()
    redis_server = setup()
    try:
        line = machine()
        workloads = [
            Workload("single-row INSERT, synchronous_commit=on", "tps",
                     {v: single_row(t) for v, t in TABLES.items()}, "none",
                     ("pg_lease", "≥ 0.97× none", at(ge, 0.97)), runs=COMMIT_RUNS).measure(),
        ]
        psql("ALTER SYSTEM SET synchronous_commit = off", db="postgres")
        psql("SELECT pg_reload_conf()", db="postgres")
        workloads.append(Workload("single-row INSERT, synchronous_commit=off", "tps",
                                  {v: single_row(t) for v, t in TABLES.items()}, "none",
                                  ("pg_lease", "≥ 0.95× none", at(ge, 0.95))).measure())
        psql("ALTER SYSTEM RESET synchronous_commit", db="postgres")
        psql("SELECT pg_reload_conf()", db="postgres")
        for resources in (1, 1000):
            w = Workload(f"100,000-row INSERT, {resources} resource{'s' if resources > 1 else ''}", "ms",
                         {v: bulk(t, resources) for v, t in TABLES.items()}, "none",
                         ("pg_lease", "≤ 1.15× none", at(le, 1.15)), before=reset_payouts)
            workloads.append(w.measure())
        fbw = "fenced_boundary_write"
        workloads.append(Workload("50-row hand settlement, 4 clients", "tps", {
            "50 INSERTs, pg_lease": settlement_inserts("p_lease"),
            fbw: settlement_json(),
            "50 INSERTs, none": settlement_inserts("p_none"),
            "50 INSERTs, plpgsql": settlement_inserts("p_plpgsql"),
        }, "50 INSERTs, pg_lease", (fbw, "≥ 1.5× 50 fenced INSERTs", lambda w: w.ratio(fbw) >= 1.5),
            subject=fbw).measure())
        workloads.append(Workload("50-row hand settlement, 2 clients", "tps", {
            "50 INSERTs, pg_lease": settlement_inserts("p_lease", clients=2), fbw: settlement_json(clients=2),
        }, "50 INSERTs, pg_lease", subject=fbw).measure())
        floor = "floor: one-row UPDATE"
        workloads.append(Workload("lease renew", "tps", {
            floor: floor_update(), "pg_lease": renew_pg(), "plpgsql": renew_plpgsql(),
            "redis": redis(REDIS_RENEW, "renew:__rand_int__", 1000),
        }, floor, ("pg_lease", "≥ 0.90× floor", at(ge, 0.90)), runs=COMMIT_RUNS).measure())
        workloads.append(Workload("lease acquire + release", "tps", {
            floor: floor_update(), "pg_lease": lease_cycle_pg(), "plpgsql": lease_cycle_plpgsql(),
            "minimal SQL": lease_cycle_minimal(), "redis": redis(REDIS_CYCLE, "cycle:__rand_int__", 1000000),
        }, floor, ("pg_lease", "≥ 0.90× floor ÷ 2", at(ge, 0.90)), divisor=2,
            baseline_note="baseline ÷ 2 (a cycle is two commits)", runs=COMMIT_RUNS).measure())
        # The same two workloads CPU-bound (context, no target): commits asynchronous, except
        # acquire's own, which pg_lease forces synchronous (its token must be durable).
        psql("ALTER SYSTEM SET synchronous_commit = off", db="postgres")
        psql("SELECT pg_reload_conf()", db="postgres")
        workloads.append(Workload("lease renew, synchronous_commit=off", "tps", {
            floor: floor_update(), "pg_lease": renew_pg(), "plpgsql": renew_plpgsql(),
        }, floor).measure())
        workloads.append(Workload("lease acquire + release, synchronous_commit=off", "tps", {
            floor: floor_update(), "pg_lease": lease_cycle_pg(), "plpgsql": lease_cycle_plpgsql(),
            "minimal SQL": lease_cycle_minimal(),
        }, floor, divisor=2, baseline_note="baseline ÷ 2 (a cycle is two commits)").measure())
        psql("ALTER SYSTEM RESET synchronous_commit", db="postgres")
        psql("SELECT pg_reload_conf()", db="postgres")
        hot = Workload(f"{HOT_CLIENTS} sessions, one resource (hot owner), synchronous_commit=off", "tps",
                       {v: hot_owner(t) for v, t in TABLES.items()}, "none",
                       ("pg_lease", "≥ 0.90× none; MultiXact growth below", at(ge, 0.90))).measure()
        workloads += [
            hot,
            hot.derived("multis", "hot owner: MultiXacts per 1,000 transactions", "per1k"),
            hot.derived("offsets", "hot owner: MultiXactOffset pages zeroed per run", "pages"),
            hot.derived("members", "hot owner: MultiXactMember pages zeroed per run", "pages"),
            hot.derived("written", "hot owner: MultiXact pages written per run", "pages"),
        ]
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
                ("pg_lease", "guard adds < 5 ms", lambda w: w.median("pg_lease") - w.median("no pg_lease") < 5),
                runs=DDL_RUNS).measure())
        # Last, on clusters of their own (the bench cluster's rows are done).
        workloads.append(replication_row())
        workloads.append(citus_row())
        workloads = [w for w in workloads if w is not None]
        report(workloads, time.time() - started, line)
    finally:
        redis_server.terminate()
        cluster("stop", "bench")


if __name__ == "__main__":
    main()
