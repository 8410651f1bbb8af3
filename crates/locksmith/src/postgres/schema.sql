-- The locksmith layout in PostgreSQL, version 2.
--
-- `__SCHEMA__` stands for the quoted schema name (default "locksmith") and
-- `__CHANNEL__` for the NOTIFY channel (the schema name). `migrate` runs this
-- in one transaction after `pg_advisory_xact_lock(<migration key>)`, so
-- concurrent first users do not race; every statement is idempotent.
--
-- Keys: a lock name's advisory key is the first 8 bytes of SHA-256 of its
-- UTF-8 bytes, read as a big-endian signed 64-bit integer:
--   SELECT ('x' || left(encode(sha256(convert_to('orders/42', 'UTF8')), 'hex'), 16))::bit(64)::bigint;
-- Semaphore slot i of a name uses the same formula over `name || '\x00' || i`.

CREATE SCHEMA IF NOT EXISTS __SCHEMA__;

CREATE TABLE IF NOT EXISTS __SCHEMA__.meta (version integer NOT NULL);

-- Fencing tokens: one sequence for every lock. CACHE 1 is essential: a
-- per-session cache would hand out numbers out of order across connections.
-- nextval() WAL-logs 32 values ahead and assigns a transaction id when it
-- does, so the commit that hands out a token flushes the record covering it:
-- tokens never go backwards, not across a crash either.
CREATE SEQUENCE IF NOT EXISTS __SCHEMA__.fencing_token AS bigint MINVALUE 1 NO CYCLE CACHE 1;

-- Session holds: each backed by a session-level advisory lock held by
-- connection `pid` (on key `key`: the lock's key, or a semaphore slot's).
-- A row outlives its hold: release only drops the advisory lock (no write),
-- and the next holder of the key takes the row over. A row is a live hold
-- exactly when `session_live(pid, key, server_start)`.
-- `quick`: an exclusive holder may take this row over in one plain statement
-- (the client's `acquire_quick`), without looking for lease holds or
-- semaphore use of the name: the last exclusive grant on it found none, and
-- whoever creates one since (a lease, a semaphore permit) has cleared the flag
-- on every row of the name (`mark_slow`) in its own transaction, while it held
-- the name's key so that no exclusive acquirer could run alongside it.
-- UNLOGGED: crash recovery empties it, and every session ends in a crash.
CREATE UNLOGGED TABLE IF NOT EXISTS __SCHEMA__.session_holds (
    token bigint NOT NULL,
    name text COLLATE "C" NOT NULL,
    key bigint NOT NULL,
    owner text NOT NULL,
    lock_by text NOT NULL,
    mode text NOT NULL CHECK (mode IN ('exclusive', 'shared', 'semaphore')),
    permits integer,
    slot integer,
    hold_count integer NOT NULL DEFAULT 1,
    lock_time timestamptz NOT NULL,
    pid integer NOT NULL,
    server_start timestamptz NOT NULL,
    quick boolean NOT NULL DEFAULT false
) WITH (fillfactor = 50);
-- Layout version 1 had no `quick`.
ALTER TABLE __SCHEMA__.session_holds ADD COLUMN IF NOT EXISTS quick boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS session_holds_name ON __SCHEMA__.session_holds (name);
-- Lets every lock acquire check "is this name a semaphore?" in an index that
-- is empty for names that are not.
CREATE INDEX IF NOT EXISTS session_holds_semaphore ON __SCHEMA__.session_holds (name)
    WHERE mode = 'semaphore';

-- Lease (TTL) holds: hold no connection; alive while lease_expires is in the
-- future by the database's clock. Logged: they survive a restart.
CREATE TABLE IF NOT EXISTS __SCHEMA__.lease_holds (
    token bigint PRIMARY KEY,
    name text COLLATE "C" NOT NULL,
    key bigint NOT NULL,
    owner text NOT NULL,
    lock_by text NOT NULL,
    mode text NOT NULL CHECK (mode IN ('exclusive', 'shared', 'semaphore')),
    permits integer,
    slot integer NOT NULL DEFAULT 0,
    hold_count integer NOT NULL DEFAULT 1,
    lock_time timestamptz NOT NULL,
    lease_expires timestamptz NOT NULL
);
-- One exclusive holder per name, one holder per semaphore slot: the
-- insert-or-take-expired upsert targets this index.
CREATE UNIQUE INDEX IF NOT EXISTS lease_holds_slot ON __SCHEMA__.lease_holds (name, slot)
    WHERE mode <> 'shared';
CREATE INDEX IF NOT EXISTS lease_holds_name ON __SCHEMA__.lease_holds (name);

-- Clients waiting outside PostgreSQL's lock queue (behind a lease hold, for a
-- semaphore slot, every wait in TTL mode), woken by NOTIFY. A release NOTIFYs
-- only when a row names its lock, so uncontended releases pay no NOTIFY.
-- `pid`: the waiting client's connection, to tell live rows from leftovers.
CREATE UNLOGGED TABLE IF NOT EXISTS __SCHEMA__.waiters (
    id bigserial PRIMARY KEY,
    name text COLLATE "C" NOT NULL,
    owner text NOT NULL,
    mode text NOT NULL,
    permits integer,
    since timestamptz NOT NULL DEFAULT clock_timestamp(),
    pid integer NOT NULL
);
CREATE INDEX IF NOT EXISTS waiters_name ON __SCHEMA__.waiters (name);

-- Whether a session hold row is backed by its advisory lock: same server
-- lifetime, and connection `p_pid` holds advisory key `p_key` (pg_locks shows
-- a bigint key as classid = high 32 bits, objid = low 32 bits, objsubid = 1;
-- PostgreSQL's SET_LOCKTAG_INT64 in src/include/storage/lock.h).
CREATE OR REPLACE FUNCTION __SCHEMA__.session_live(p_pid integer, p_key bigint, p_server_start timestamptz)
RETURNS boolean LANGUAGE sql VOLATILE AS $fn$
    SELECT p_server_start = pg_postmaster_start_time() AND EXISTS (
        SELECT 1 FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.granted AND l.pid = p_pid
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND l.classid = ((p_key >> 32) & 4294967295)::oid
           AND l.objid = (p_key & 4294967295)::oid
           AND l.objsubid = 1)
$fn$;

-- Milliseconds until `t`, rounded up, at least 1.
CREATE OR REPLACE FUNCTION __SCHEMA__.ms_until(t timestamptz)
RETURNS bigint LANGUAGE sql VOLATILE AS $fn$
    SELECT greatest(1, ceil(extract(epoch FROM t - clock_timestamp()) * 1000))::bigint
$fn$;

-- NOTIFY `<schema>` with the name, when a head waiter waits for it.
CREATE OR REPLACE FUNCTION __SCHEMA__.wake(p_name text)
RETURNS void LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    IF EXISTS (SELECT 1 FROM __SCHEMA__.waiters w WHERE w.name = p_name) THEN
        PERFORM pg_notify('__CHANNEL__', p_name);
    END IF;
END
$fn$;

-- Takes lease slot `p_slot` of `p_name` (0 for an exclusive lock) if it is
-- free or its lease has run out: the insert-or-take-expired upsert, one
-- statement, on the unique index of (name, slot). No row when it is held.
CREATE OR REPLACE FUNCTION __SCHEMA__.take_lease_slot(
    p_name text, p_key bigint, p_owner text, p_lock_by text, p_mode text,
    p_permits integer, p_slot integer, p_lease_ms bigint)
RETURNS TABLE (token bigint, lock_time timestamptz, lease_expires timestamptz)
LANGUAGE sql VOLATILE AS $fn$
    INSERT INTO __SCHEMA__.lease_holds AS l
           (token, name, key, owner, lock_by, mode, permits, slot, lock_time, lease_expires)
    VALUES (nextval('__SCHEMA__.fencing_token'), p_name, p_key, p_owner, p_lock_by, p_mode,
            p_permits, p_slot, clock_timestamp(),
            clock_timestamp() + p_lease_ms * interval '1 millisecond')
    ON CONFLICT (name, slot) WHERE mode <> 'shared' DO UPDATE
       SET token = EXCLUDED.token, key = EXCLUDED.key, owner = EXCLUDED.owner,
           lock_by = EXCLUDED.lock_by, mode = EXCLUDED.mode, permits = EXCLUDED.permits,
           hold_count = 1, lock_time = EXCLUDED.lock_time, lease_expires = EXCLUDED.lease_expires
     WHERE l.lease_expires <= clock_timestamp()
    RETURNING l.token, l.lock_time, l.lease_expires
$fn$;

-- Clears `quick` on the session rows of lock `p_name` (key `p_key`): called
-- in the transaction that creates a lease hold or a semaphore permit of the
-- name, so exclusive acquirers look before they take a row again.
CREATE OR REPLACE FUNCTION __SCHEMA__.mark_slow(p_name text, p_key bigint)
RETURNS void LANGUAGE sql VOLATILE AS $fn$
    UPDATE __SCHEMA__.session_holds s SET quick = false
     WHERE s.name = p_name AND s.key = p_key AND s.quick
$fn$;

-- A live hold that keeps a request in `p_mode` (`p_permits`) off the name for
-- good: a semaphore with another permit count, or a semaphore and a lock on
-- one name. NULL when there is none.
CREATE OR REPLACE FUNCTION __SCHEMA__.mode_conflict(p_name text, p_mode text, p_permits integer)
RETURNS text LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT s.mode, s.permits FROM __SCHEMA__.session_holds s
              WHERE s.name = p_name
                AND CASE WHEN p_mode = 'semaphore'
                         THEN s.mode <> 'semaphore' OR s.permits IS DISTINCT FROM p_permits
                         ELSE s.mode = 'semaphore' END
                AND __SCHEMA__.session_live(s.pid, s.key, s.server_start)
             UNION ALL
             SELECT l.mode, l.permits FROM __SCHEMA__.lease_holds l
              WHERE l.name = p_name AND l.lease_expires > clock_timestamp()
                AND CASE WHEN p_mode = 'semaphore'
                         THEN l.mode <> 'semaphore' OR l.permits IS DISTINCT FROM p_permits
                         ELSE l.mode = 'semaphore' END
    LOOP
        IF r.mode = 'semaphore' THEN
            RETURN format('held as a semaphore of %s permits', r.permits);
        END IF;
        RETURN format('held as a %s lock, not as a semaphore', r.mode);
    END LOOP;
    RETURN NULL;
END
$fn$;

-- Records a session hold of key `p_key` by this connection, taking over a
-- row the hold proves stale, and returns its new token and lock time.
-- Holding `p_key` exclusively (exclusive mode, semaphore slot) makes every
-- row of the key stale; holding it shared makes exclusive rows stale, and
-- rows of this connection (a connection holds at most one hold per name).
CREATE OR REPLACE FUNCTION __SCHEMA__.record_session(
    p_name text, p_key bigint, p_owner text, p_lock_by text, p_mode text,
    p_permits integer, p_slot integer, OUT token bigint, OUT lock_time timestamptz)
LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
BEGIN
    token := nextval('__SCHEMA__.fencing_token');
    UPDATE __SCHEMA__.session_holds s
       SET token = record_session.token, owner = p_owner, lock_by = p_lock_by, mode = p_mode,
           permits = p_permits, slot = p_slot, hold_count = 1, lock_time = clock_timestamp(),
           pid = pg_backend_pid(), server_start = pg_postmaster_start_time(), quick = false
     WHERE s.ctid = (SELECT o.ctid FROM __SCHEMA__.session_holds o
                      WHERE o.name = p_name AND o.key = p_key
                        AND (p_mode <> 'shared' OR o.mode <> 'shared'
                             OR (o.pid = pg_backend_pid() AND o.server_start = pg_postmaster_start_time()))
                      LIMIT 1)
    RETURNING s.lock_time INTO lock_time;
    IF NOT FOUND THEN
        INSERT INTO __SCHEMA__.session_holds AS s
               (token, name, key, owner, lock_by, mode, permits, slot, lock_time, pid, server_start)
        VALUES (record_session.token, p_name, p_key, p_owner, p_lock_by, p_mode, p_permits, p_slot,
                clock_timestamp(), pg_backend_pid(), pg_postmaster_start_time())
        RETURNING s.lock_time INTO lock_time;
    END IF;
END
$fn$;

-- Session acquire on this connection. Takes the advisory lock (or, with
-- `p_held`, finds it already taken by the caller's pg_advisory_lock wait),
-- then, in statements that see everything committed before the grant, looks
-- for conflicting lease holds, and records the hold with a new token.
--
-- Exclusive / shared: the advisory lock on `p_key` in that mode.
-- Semaphore: a turnstile on `p_key` (shared for a try, exclusive for waiters
-- queued in PostgreSQL's lock queue, so a try never passes a waiter), then
-- the first free slot key of `p_slot_keys`. The turnstile is held until the
-- grant is committed (a try's is transaction-level; a waiter drops its own
-- after this call), so no exclusive acquirer can take a lock row of the name
-- before `mark_slow` is visible.
--
-- status 'granted' | 'busy' | 'conflict'. Busy: retry_ms is when the first
-- blocking lease ends (NULL when a session holder blocks). A busy answer
-- keeps the advisory lock on `p_key` only when `p_held` (the caller waits on).
CREATE OR REPLACE FUNCTION __SCHEMA__.acquire_session(
    p_name text, p_key bigint, p_slot_keys bigint[], p_owner text, p_lock_by text,
    p_mode text, p_permits integer, p_held boolean,
    OUT status text, OUT token bigint, OUT lock_time timestamptz, OUT slot integer,
    OUT retry_ms bigint, OUT detail text)
LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    v_key bigint;
    v_blocked boolean := false;
    v_until timestamptz;
    v_semaphore boolean;
BEGIN
    IF p_mode = 'semaphore' THEN
        detail := __SCHEMA__.mode_conflict(p_name, p_mode, p_permits);
        IF detail IS NOT NULL THEN
            status := 'conflict';
            RETURN;
        END IF;
        IF NOT p_held AND NOT pg_try_advisory_xact_lock_shared(p_key) THEN
            status := 'busy';
            RETURN;
        END IF;
        FOR i IN 0 .. p_permits - 1 LOOP
            v_key := p_slot_keys[i + 1];
            IF NOT pg_try_advisory_lock(v_key) THEN
                v_blocked := true;
                CONTINUE;
            END IF;
            SELECT l.lease_expires INTO v_until FROM __SCHEMA__.lease_holds l
             WHERE l.name = p_name AND l.slot = i AND l.mode = 'semaphore'
               AND l.lease_expires > clock_timestamp();
            IF FOUND THEN
                PERFORM pg_advisory_unlock(v_key);
                retry_ms := least(retry_ms, __SCHEMA__.ms_until(v_until));
                CONTINUE;
            END IF;
            SELECT r.token, r.lock_time INTO token, lock_time
              FROM __SCHEMA__.record_session(p_name, v_key, p_owner, p_lock_by, p_mode, p_permits, i) r;
            PERFORM __SCHEMA__.mark_slow(p_name, p_key);
            slot := i;
            status := 'granted';
            RETURN;
        END LOOP;
        IF v_blocked THEN
            retry_ms := NULL;
        END IF;
        status := 'busy';
        RETURN;
    END IF;

    IF NOT p_held THEN
        IF p_mode = 'exclusive' THEN
            IF NOT pg_try_advisory_lock(p_key) THEN
                status := 'busy';
                RETURN;
            END IF;
        ELSIF NOT pg_try_advisory_lock_shared(p_key) THEN
            status := 'busy';
            RETURN;
        END IF;
    END IF;
    -- One probe: conflicting lease holds, and whether the name is a semaphore.
    SELECT min(l.lease_expires) FILTER (WHERE l.mode <> 'semaphore'
                                          AND (p_mode = 'exclusive' OR l.mode = 'exclusive')),
           coalesce(bool_or(l.mode = 'semaphore'), false)
           OR EXISTS (SELECT 1 FROM __SCHEMA__.session_holds s
                       WHERE s.name = p_name AND s.mode = 'semaphore'
                         AND __SCHEMA__.session_live(s.pid, s.key, s.server_start))
      INTO v_until, v_semaphore
      FROM __SCHEMA__.lease_holds l
     WHERE l.name = p_name AND l.lease_expires > clock_timestamp();
    IF v_semaphore THEN
        detail := __SCHEMA__.mode_conflict(p_name, p_mode, p_permits);
        status := 'conflict';
    ELSIF v_until IS NOT NULL THEN
        retry_ms := __SCHEMA__.ms_until(v_until);
        status := 'busy';
    END IF;
    IF status IS NOT NULL THEN
        IF NOT p_held THEN
            IF p_mode = 'exclusive' THEN
                PERFORM pg_advisory_unlock(p_key);
            ELSE
                PERFORM pg_advisory_unlock_shared(p_key);
            END IF;
        END IF;
        RETURN;
    END IF;
    -- record_session, inlined. An exclusive grant has found no lease hold and
    -- no semaphore use: its row may be taken over quickly next time.
    UPDATE __SCHEMA__.session_holds s
       SET token = nextval('__SCHEMA__.fencing_token'), owner = p_owner, lock_by = p_lock_by, mode = p_mode,
           permits = NULL, slot = NULL, hold_count = 1, lock_time = clock_timestamp(),
           pid = pg_backend_pid(), server_start = pg_postmaster_start_time(),
           quick = (p_mode = 'exclusive')
     WHERE s.ctid = (SELECT o.ctid FROM __SCHEMA__.session_holds o
                      WHERE o.name = p_name AND o.key = p_key
                        AND (p_mode <> 'shared' OR o.mode <> 'shared'
                             OR (o.pid = pg_backend_pid() AND o.server_start = pg_postmaster_start_time()))
                      LIMIT 1)
    RETURNING s.token, s.lock_time INTO token, lock_time;
    IF NOT FOUND THEN
        INSERT INTO __SCHEMA__.session_holds AS s
               (token, name, key, owner, lock_by, mode, lock_time, pid, server_start, quick)
        VALUES (nextval('__SCHEMA__.fencing_token'), p_name, p_key, p_owner, p_lock_by, p_mode,
                clock_timestamp(), pg_backend_pid(), pg_postmaster_start_time(), p_mode = 'exclusive')
        RETURNING s.token, s.lock_time INTO token, lock_time;
    END IF;
    status := 'granted';
END
$fn$;

-- Session release of a semaphore slot: drops the slot's advisory lock (the
-- row stays, to be taken over by the next holder) and wakes NOTIFY waiters of
-- the name if there are any. False when this connection did not hold it.
-- (A lock's release is a plain pg_advisory_unlock: no head waiter can be
-- waiting for a session hold of a lock, since a head holds the key itself.)
CREATE OR REPLACE FUNCTION __SCHEMA__.release_session(p_name text, p_key bigint, p_shared boolean)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_unlocked boolean;
BEGIN
    IF p_shared THEN
        v_unlocked := pg_advisory_unlock_shared(p_key);
    ELSE
        v_unlocked := pg_advisory_unlock(p_key);
    END IF;
    PERFORM __SCHEMA__.wake(p_name);
    RETURN v_unlocked;
END
$fn$;

-- Lease acquire, one transaction: a transaction-level try-lock on the
-- advisory key (it fails while a session holder, or a plain
-- pg_advisory_lock caller, holds the key in a conflicting mode; semaphores:
-- the turnstile shared and the slot key), then the insert-or-take-expired
-- upsert on lease_holds. Same answers as acquire_session, plus the expiry.
-- `p_held`: the connection holds the key at session level (a waiter at the
-- head of the queue); the semaphore turnstile is then skipped, since a shared
-- request would queue behind the exclusive waiters after it.
-- A grant clears `quick` on the name's session rows (`mark_slow`).
CREATE OR REPLACE FUNCTION __SCHEMA__.acquire_lease(
    p_name text, p_key bigint, p_slot_keys bigint[], p_owner text, p_lock_by text,
    p_mode text, p_permits integer, p_lease_ms bigint, p_held boolean,
    OUT status text, OUT token bigint, OUT lock_time timestamptz, OUT lease_expires timestamptz,
    OUT slot integer, OUT retry_ms bigint, OUT detail text)
LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    v_key bigint;
    v_blocked boolean := false;
    v_until timestamptz;
BEGIN
    detail := __SCHEMA__.mode_conflict(p_name, p_mode, p_permits);
    IF detail IS NOT NULL THEN
        status := 'conflict';
        RETURN;
    END IF;
    IF p_mode = 'semaphore' THEN
        IF NOT p_held AND NOT pg_try_advisory_xact_lock_shared(p_key) THEN
            status := 'busy';
            RETURN;
        END IF;
        FOR i IN 0 .. p_permits - 1 LOOP
            v_key := p_slot_keys[i + 1];
            IF NOT pg_try_advisory_xact_lock(v_key) THEN
                v_blocked := true;
                CONTINUE;
            END IF;
            SELECT t.token, t.lock_time, t.lease_expires INTO token, lock_time, lease_expires
              FROM __SCHEMA__.take_lease_slot(p_name, v_key, p_owner, p_lock_by, p_mode,
                                              p_permits, i, p_lease_ms) t;
            IF FOUND THEN
                PERFORM __SCHEMA__.mark_slow(p_name, p_key);
                slot := i;
                status := 'granted';
                RETURN;
            END IF;
            SELECT l.lease_expires INTO v_until FROM __SCHEMA__.lease_holds l
             WHERE l.name = p_name AND l.slot = i AND l.mode <> 'shared';
            retry_ms := least(retry_ms, __SCHEMA__.ms_until(v_until));
        END LOOP;
        IF v_blocked THEN
            retry_ms := NULL;
        END IF;
        status := 'busy';
        RETURN;
    END IF;

    IF p_mode = 'exclusive' THEN
        IF NOT pg_try_advisory_xact_lock(p_key) THEN
            status := 'busy';
            RETURN;
        END IF;
    ELSIF NOT pg_try_advisory_xact_lock_shared(p_key) THEN
        status := 'busy';
        RETURN;
    END IF;
    IF p_mode = 'exclusive' THEN
        SELECT min(l.lease_expires) INTO v_until FROM __SCHEMA__.lease_holds l
         WHERE l.name = p_name AND l.mode = 'shared' AND l.lease_expires > clock_timestamp();
        IF v_until IS NOT NULL THEN
            retry_ms := __SCHEMA__.ms_until(v_until);
            status := 'busy';
            RETURN;
        END IF;
        SELECT t.token, t.lock_time, t.lease_expires INTO token, lock_time, lease_expires
          FROM __SCHEMA__.take_lease_slot(p_name, p_key, p_owner, p_lock_by, p_mode,
                                          NULL, 0, p_lease_ms) t;
        IF FOUND THEN
            PERFORM __SCHEMA__.mark_slow(p_name, p_key);
            status := 'granted';
            RETURN;
        END IF;
        SELECT l.lease_expires INTO v_until FROM __SCHEMA__.lease_holds l
         WHERE l.name = p_name AND l.slot = 0 AND l.mode <> 'shared';
        retry_ms := __SCHEMA__.ms_until(v_until);
        status := 'busy';
        RETURN;
    END IF;
    SELECT min(l.lease_expires) INTO v_until FROM __SCHEMA__.lease_holds l
     WHERE l.name = p_name AND l.mode = 'exclusive' AND l.lease_expires > clock_timestamp();
    IF v_until IS NOT NULL THEN
        retry_ms := __SCHEMA__.ms_until(v_until);
        status := 'busy';
        RETURN;
    END IF;
    DELETE FROM __SCHEMA__.lease_holds l
     WHERE l.name = p_name AND l.mode <> 'semaphore' AND l.lease_expires <= clock_timestamp();
    INSERT INTO __SCHEMA__.lease_holds AS l
           (token, name, key, owner, lock_by, mode, slot, lock_time, lease_expires)
    VALUES (nextval('__SCHEMA__.fencing_token'), p_name, p_key, p_owner, p_lock_by, p_mode, 0,
            clock_timestamp(), clock_timestamp() + p_lease_ms * interval '1 millisecond')
    RETURNING l.token, l.lock_time, l.lease_expires INTO token, lock_time, lease_expires;
    PERFORM __SCHEMA__.mark_slow(p_name, p_key);
    status := 'granted';
END
$fn$;

-- Lease renewal, only while the lease still runs (a lapsed lease may already
-- have been granted to someone who did not see it). Returns the new expiry
-- and the milliseconds left, or no row.
CREATE OR REPLACE FUNCTION __SCHEMA__.renew_lease(p_name text, p_token bigint, p_owner text, p_lease_ms bigint)
RETURNS TABLE (lease_expires timestamptz) LANGUAGE sql VOLATILE AS $fn$
    UPDATE __SCHEMA__.lease_holds l
       SET lease_expires = clock_timestamp() + p_lease_ms * interval '1 millisecond'
     WHERE l.name = p_name AND l.token = p_token AND l.owner = p_owner
       AND l.lease_expires > clock_timestamp()
    RETURNING l.lease_expires
$fn$;

-- Lease release: owner-checked delete; 'released', 'expired' (ours, but it
-- had lapsed) or 'gone'. Commits asynchronously: a release lost in a crash
-- only keeps the lock until its lease runs out, and any later grant's
-- synchronous commit flushes it anyway.
CREATE OR REPLACE FUNCTION __SCHEMA__.release_lease(p_name text, p_token bigint, p_owner text)
RETURNS text LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_live boolean;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    DELETE FROM __SCHEMA__.lease_holds l
     WHERE l.name = p_name AND l.token = p_token AND l.owner = p_owner
    RETURNING l.lease_expires > clock_timestamp() INTO v_live;
    IF NOT FOUND THEN
        RETURN 'gone';
    END IF;
    PERFORM __SCHEMA__.wake(p_name);
    RETURN CASE WHEN v_live THEN 'released' ELSE 'expired' END;
END
$fn$;

-- Transaction-scoped hold (PgBouncer transaction mode): the caller holds
-- pg_advisory_xact_lock(p_key) in its transaction (or takes it here with
-- `p_try`); checks lease holds and hands out a token. Nothing is recorded: a
-- row written in the caller's transaction would only become visible when the
-- lock is gone again. Inspection shows such holders by their pid.
CREATE OR REPLACE FUNCTION __SCHEMA__.acquire_xact(
    p_name text, p_key bigint, p_mode text, p_try boolean,
    OUT status text, OUT token bigint, OUT retry_ms bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    v_until timestamptz;
BEGIN
    IF p_try THEN
        IF p_mode = 'exclusive' THEN
            IF NOT pg_try_advisory_xact_lock(p_key) THEN
                status := 'busy';
                RETURN;
            END IF;
        ELSIF NOT pg_try_advisory_xact_lock_shared(p_key) THEN
            status := 'busy';
            RETURN;
        END IF;
    END IF;
    SELECT min(l.lease_expires) INTO v_until FROM __SCHEMA__.lease_holds l
     WHERE l.name = p_name AND l.mode <> 'semaphore' AND l.lease_expires > clock_timestamp()
       AND (p_mode = 'exclusive' OR l.mode = 'exclusive');
    IF v_until IS NOT NULL THEN
        retry_ms := __SCHEMA__.ms_until(v_until);
        status := 'busy';
        RETURN;
    END IF;
    token := nextval('__SCHEMA__.fencing_token');
    status := 'granted';
END
$fn$;

-- Removes what no hold and no waiter needs any more: session rows whose
-- advisory lock is gone, lapsed leases, waiter rows of ended connections.
CREATE OR REPLACE FUNCTION __SCHEMA__.cleanup()
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_count bigint;
    v_more bigint;
BEGIN
    DELETE FROM __SCHEMA__.session_holds s
     WHERE s.lock_time < clock_timestamp() - interval '1 minute'
       AND NOT __SCHEMA__.session_live(s.pid, s.key, s.server_start);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    DELETE FROM __SCHEMA__.lease_holds l WHERE l.lease_expires < clock_timestamp() - interval '1 minute';
    GET DIAGNOSTICS v_more = ROW_COUNT;
    v_count := v_count + v_more;
    DELETE FROM __SCHEMA__.waiters w
     WHERE w.since < clock_timestamp() - interval '1 minute'
       AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.pid);
    GET DIAGNOSTICS v_more = ROW_COUNT;
    RETURN v_count + v_more;
END
$fn$;

-- Every hold in one place, for people and tools; `live` tells current holds
-- from rows that only wait to be taken over.
CREATE OR REPLACE VIEW __SCHEMA__.holds AS
    SELECT name, key, owner, lock_by, mode, permits, slot, token, hold_count, lock_time,
           NULL::timestamptz AS lease_expires, pid, 'session'::text AS kind,
           __SCHEMA__.session_live(pid, key, server_start) AS live
      FROM __SCHEMA__.session_holds
    UNION ALL
    SELECT name, key, owner, lock_by, mode, permits, slot, token, hold_count, lock_time,
           lease_expires, NULL::integer, 'lease'::text, lease_expires > clock_timestamp()
      FROM __SCHEMA__.lease_holds;
