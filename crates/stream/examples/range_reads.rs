//! What a continued range saves: reading a partition's consecutive offset ranges with one
//! consumer assignment, against a new assignment for every range.
//!
//! ```text
//! cargo run --release -p elastrec-stream --example range_reads -- [BROKERS] [MESSAGES] [RANGE]
//! ```
//!
//! Without `BROKERS` (or with `-`) an in-process mock cluster (librdkafka's) serves the
//! topic; a real broker needs the topic `ranges` with 2 partitions created first. Two
//! partitions get about `MESSAGES / 2` Criteo-layout messages each. Then the same ranges of
//! `RANGE` offsets are read twice with one `StreamInput`:
//! - **continued**: partition 0's ranges in order, then partition 1's: every range starts
//!   where the previous one ended, so the consumer reads on (what the master's
//!   `TaskQueue::continuation` arranges for a worker);
//! - **alternating**: partition 0, 1, 0, 1, ...: every range needs a new assignment, as
//!   when a worker gets the next task of the shared queue, whatever its partition.
//!
//! Each pass is timed and its foreign CPU load measured (`elastrec_common::quiet`); a
//! pass above 5% is flagged (a broker in another process counts as foreign load).

use std::time::{Duration, Instant};

use elastrec_common::quiet::LoadProbe;
use elastrec_data::{BadRowPolicy, Batch, BatchReader, RawRow, NUM_DENSE, NUM_SPARSE};
use elastrec_stream::{
    replay, Connection, MessageFormat, PartitionId, Partitioner, ReplaySpec, StreamInput,
    TopicWatch, Trace,
};
use rdkafka::mocking::MockCluster;

const TOPIC: &str = "ranges";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mock;
    let external = args.first().filter(|a| a.as_str() != "-");
    let brokers = match external {
        Some(b) => b.clone(),
        None => {
            mock = MockCluster::new(1)?;
            mock.create_topic(TOPIC, 2, 1)?;
            mock.bootstrap_servers()
        }
    };
    let messages: u64 = args.get(1).map_or(Ok(100_000), |a| a.parse())?;
    let range: u64 = args.get(2).map_or(Ok(512), |a| a.parse())?;
    let conn = Connection::new(brokers);
    let dir = std::env::temp_dir().join(format!("elastrec-range-reads-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("rows.tsv");
    let mut buf = Vec::new();
    for i in 0..messages {
        elastrec_data::tsv::write_row(&row(i), &mut buf);
    }
    std::fs::write(&file, buf)?;
    eprintln!("producing {messages} messages into {TOPIC} (2 partitions)...");
    // Against a real broker, one record per produce request: Tansu 0.6's memory engine
    // gives a multi-record batch fewer offsets than records. (The mock keeps batches: it
    // serves single-record batches one per fetch, which would measure only that.)
    let mut producer = conn.clone();
    if external.is_some() {
        producer
            .properties
            .insert("batch.num.messages".into(), "1".into());
    }
    replay(
        &ReplaySpec {
            conn: producer,
            topic: TOPIC.into(),
            files: vec![file],
            repeat: false,
            format: MessageFormat::Tsv,
            samples_per_message: 1,
            trace: Trace::constant(1e7, 600.0),
            partitioner: Partitioner::RoundRobin,
            seed: 1,
        },
        |_| {},
    )?;
    std::fs::remove_dir_all(&dir)?;
    let watch = TopicWatch::new(&conn, "range-reads", Duration::from_secs(10))?;
    let parts = watch.partitions(&[TOPIC.to_string()])?;
    let per = watch
        .watermarks(&parts)?
        .iter()
        .map(|&(low, high)| high - low)
        .min()
        .unwrap_or(0);
    let ranges: Vec<(u64, u64)> = (0..per.div_ceil(range))
        .map(|k| (k * range, ((k + 1) * range).min(per)))
        .collect();
    let continued: Vec<(usize, (u64, u64))> = (0..2)
        .flat_map(|p| ranges.iter().map(move |&r| (p, r)))
        .collect();
    let alternating: Vec<(usize, (u64, u64))> =
        ranges.iter().flat_map(|&r| [(0, r), (1, r)]).collect();
    println!(
        "| order | ranges | assignments | seconds | messages/s | ms per range | foreign CPU |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let a = pass("continued", &conn, &parts, &continued)?;
    let b = pass("alternating", &conn, &parts, &alternating)?;
    println!(
        "continued ranges read {:.2}x as fast as alternating ones ({range} offsets per range)",
        b.0 / a.0
    );
    if !(a.1 && b.1) {
        // A broker outside this process (not the mock) shows up here too.
        println!(
            "warning: other processes used more than 5% of the CPU during a pass (a separate \
             broker's own work counts too): compare with a run on a quiet machine"
        );
    }
    Ok(())
}

/// Reads `order` with one fresh input; returns (seconds, quiet).
fn pass(
    name: &str,
    conn: &Connection,
    parts: &[PartitionId],
    order: &[(usize, (u64, u64))],
) -> Result<(f64, bool), Box<dyn std::error::Error>> {
    let input = StreamInput::new(conn, &format!("range-reads-{name}"), MessageFormat::Tsv)?;
    let mut batch = Batch::with_capacity(128);
    let probe = LoadProbe::start();
    let t = Instant::now();
    let mut read = 0u64;
    for &(p, (start, end)) in order {
        let mut r = input.range(&parts[p], start, end, BadRowPolicy::Fail)?;
        loop {
            let n = r.next_batch(&mut batch, 128)?;
            if n == 0 {
                break;
            }
            read += n as u64;
        }
    }
    let s = t.elapsed().as_secs_f64();
    let load = probe.and_then(|p| p.stop());
    let quiet = load.is_some_and(|l| l.is_quiet(0.05));
    println!(
        "| {name} | {} | {} | {s:.2} | {:.0} | {:.2} | {} |",
        order.len(),
        input.assignments(),
        read as f64 / s,
        1e3 * s / order.len() as f64,
        load.map_or("-".into(), |l| format!("{:.1}%", 100.0 * l.foreign_share()))
    );
    Ok((s, quiet))
}

/// A valid Criteo-layout row.
fn row(i: u64) -> RawRow {
    let mut r = RawRow {
        label: u8::from(i.is_multiple_of(4)),
        ..RawRow::default()
    };
    for k in 0..NUM_DENSE {
        r.ints[k] = Some((i % 97) as i64 + k as i64);
    }
    for k in 0..NUM_SPARSE {
        r.cats[k] = Some((i as u32).wrapping_mul(2_654_435_761) ^ k as u32);
    }
    r
}
