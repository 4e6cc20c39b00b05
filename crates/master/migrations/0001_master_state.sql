-- The job master's durable state. Every change is written here before the reply that
-- depends on it is sent, so a master restarted on this file loses nothing.

CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS tasks (
    id          INTEGER PRIMARY KEY NOT NULL,
    epoch       INTEGER NOT NULL,
    file        INTEGER NOT NULL,
    start_row   INTEGER NOT NULL,
    end_row     INTEGER NOT NULL,
    offset_rows INTEGER NOT NULL,
    state       TEXT    NOT NULL,   -- todo | doing | done
    worker      INTEGER,            -- holder while doing
    ord         INTEGER NOT NULL    -- queue position, smaller first
);

CREATE TABLE IF NOT EXISTS ledger (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    epoch     INTEGER NOT NULL,
    file      INTEGER NOT NULL,
    start_row INTEGER NOT NULL,
    end_row   INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS nodes (
    id           INTEGER PRIMARY KEY NOT NULL,
    role         TEXT    NOT NULL,
    idx          INTEGER NOT NULL,
    state        TEXT    NOT NULL,
    pid          INTEGER NOT NULL,
    addr         TEXT    NOT NULL,
    last_seen_ms INTEGER NOT NULL,
    started_ms   INTEGER NOT NULL,
    samples      INTEGER NOT NULL,
    step         INTEGER NOT NULL,
    restarts     INTEGER NOT NULL
);
