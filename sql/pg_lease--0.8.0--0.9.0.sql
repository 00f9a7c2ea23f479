-- pg_lease 0.8.0 -> 0.9.0: issue #13. The token rule is Rust
-- (src/lease.rs, token_rule): lease.acquire applies it without a statement,
-- reading the epoch tables directly, and lease._next_token, which
-- lease.token_ceiling and lease.issue_tokens_above call, is now the same rule
-- as a C function (VOLATILE: it reads the tables as a statement run at that
-- moment would).
\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0.9.0'" to load this file. \quit

DROP FUNCTION lease._next_token(bigint, bigint);
CREATE  FUNCTION lease."_next_token"(
	"stored" bigint, /* i64 */
	"timeline" bigint /* i64 */
) RETURNS TABLE (
	"token" bigint,  /* Option < i64 > */
	"epoch" bigint,  /* i64 */
	"issued" bigint,  /* Option < i64 > */
	"raise_base" bigint  /* Option < i64 > */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'next_token_sql_wrapper';
COMMENT ON FUNCTION lease._next_token(bigint, bigint) IS
    'The next fencing token after stored on timeline, by the epoch rule (NULL when none is left), with the epoch and the base raise it needs (internal).';
REVOKE EXECUTE ON FUNCTION lease._next_token(bigint, bigint) FROM PUBLIC;
