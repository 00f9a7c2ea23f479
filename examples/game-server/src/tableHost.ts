// A game-server process that hosts poker tables with pg_lease: the shape of
// the real server, reduced to what matters for ownership.
//
//   load          -> lease.acquire(..., 'tables', [id]): lease + owner-row token in one call
//   heartbeat     -> lease.heartbeat every TTL/3 (one row write); each row is a lost table: freeze it
//   settleHand    -> lease.fenced_boundary_write; LF001 freezes the table and is never retried
//   shutdown      -> lease.release_all (the SIGTERM path)

import pg from "pg";

export type Payout = { player: string; amount: number };

export class FencedError extends Error {
  constructor(readonly code: string, message: string) {
    super(message);
  }
}

/** The SQLSTATEs a table host reacts to. */
export const SQLSTATE = {
  staleOwner: "LF001", // another process owns the table now: freeze, never retry
  tokenAhead: "LF002", // our token is unknown to the database (e.g. lost in a failover): freeze
  ownedElsewhere: "LF005", // someone else hosts the table: do not load it
  leaseLost: "LF006",
  serializationFailure: "40001", // retry the transaction
} as const;

type Table = { id: number; token: bigint; frozen: boolean; hand: number };

export class TableHost {
  private readonly tables = new Map<number, Table>();
  private heartbeatTimer: NodeJS.Timeout | undefined;
  /** Called when a table is frozen, with the reason. */
  onFreeze: (tableId: number, reason: string) => void = () => {};

  constructor(
    private readonly pool: pg.Pool,
    readonly hostId: string,
    readonly ttlMs = 15_000,
  ) {}

  table(id: number): Readonly<Table> | undefined {
    return this.tables.get(id);
  }

  /**
   * Takes (or re-takes) the table's lease and stamps the new token on its owner
   * row (which the migrator created: the application role cannot insert one).
   */
  async load(tableId: number): Promise<bigint | undefined> {
    try {
      const { rows } = await this.pool.query<{ token: string }>(
        "SELECT token FROM lease.acquire($1, $2, $3, 'tables', ARRAY[$4::text])",
        [`table:${tableId}`, this.hostId, this.ttlMs, tableId],
      );
      const token = BigInt(rows[0].token);
      const hand = await this.lastHand(tableId);
      this.tables.set(tableId, { id: tableId, token, frozen: false, hand });
      return token;
    } catch (err) {
      if (sqlstate(err) === SQLSTATE.ownedElsewhere) return undefined;
      throw err;
    }
  }

  private async lastHand(tableId: number): Promise<number> {
    const { rows } = await this.pool.query<{ hand: number | null }>(
      "SELECT max(hand) AS hand FROM payouts WHERE table_id = $1",
      [tableId],
    );
    return rows[0].hand ?? 0;
  }

  /** Settles the next hand of a table: all payouts in one fenced write, or nothing. */
  async settleHand(tableId: number, payouts: Payout[]): Promise<number> {
    const table = this.tables.get(tableId);
    if (!table || table.frozen) throw new Error(`table ${tableId} is not hosted here`);
    const hand = table.hand + 1;
    const rows = payouts.map((p) => ({ table_id: tableId, hand, player: p.player, amount: p.amount }));
    for (let attempt = 1; ; attempt++) {
      try {
        const { rows: r } = await this.pool.query<{ n: string }>(
          "SELECT lease.fenced_boundary_write('payouts', $1, $2::jsonb) AS n",
          [table.token.toString(), JSON.stringify(rows)],
        );
        table.hand = hand;
        return Number(r[0].n);
      } catch (err) {
        const code = sqlstate(err);
        if (code === SQLSTATE.serializationFailure && attempt < 5) continue;
        if (code === SQLSTATE.staleOwner || code === SQLSTATE.tokenAhead) {
          this.freeze(tableId, `${code}: ${(err as Error).message}`);
          throw new FencedError(code, (err as Error).message);
        }
        throw err;
      }
    }
  }

  /** One heartbeat: keeps every lease of this host alive, freezes the lost ones. */
  async heartbeat(): Promise<void> {
    const { rows } = await this.pool.query<{ name: string; lost: string }>(
      "SELECT name, lost FROM lease.heartbeat($1, $2)",
      [this.hostId, this.ttlMs],
    );
    for (const row of rows) {
      this.freeze(Number(row.name.replace("table:", "")), `lease lost (${row.lost})`);
    }
  }

  startHeartbeat(): void {
    this.heartbeatTimer = setInterval(() => {
      this.heartbeat().catch((err) => console.error("heartbeat failed:", err));
    }, Math.floor(this.ttlMs / 3));
  }

  freeze(tableId: number, reason: string): void {
    const table = this.tables.get(tableId);
    if (table && !table.frozen) {
      table.frozen = true;
      this.onFreeze(tableId, reason);
    }
  }

  /** The SIGTERM path: stop heartbeating, release every lease so the next process takes over at once. */
  async shutdown(): Promise<number> {
    clearInterval(this.heartbeatTimer);
    const { rows } = await this.pool.query<{ n: number }>("SELECT lease.release_all($1) AS n", [this.hostId]);
    for (const id of this.tables.keys()) this.freeze(id, "shutting down");
    return rows[0].n;
  }
}

export function sqlstate(err: unknown): string | undefined {
  return typeof err === "object" && err !== null && "code" in err ? String((err as { code: unknown }).code) : undefined;
}
