//! The `elastrec` binary: thin glue over the library crates.
use clap::Parser;

#[derive(Parser)]
#[command(name = "elastrec", version, about = "Elastic, failure-tolerant DLRM training")]
enum Cli {}

fn main() {
    let _ = Cli::parse();
}
