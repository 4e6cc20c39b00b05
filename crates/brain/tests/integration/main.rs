//! Integration tests of the brain: the config database on SQLite and on a real PostgreSQL
//! started by the test, and the gRPC service on loopback.

mod db;
mod job_file;
mod pg;
mod service;
