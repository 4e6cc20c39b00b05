//! The stream crate against a real Kafka-protocol broker (Tansu, started per test on a
//! loopback port), driven through the same client code a job uses.

use std::path::{Path, PathBuf};
use std::time::Duration;

use elastrec_data::{criteo, BadRowPolicy, Batch, BatchReader, DataError, RawRow};
use elastrec_stream::tansu::Tansu;

#[path = "support/secure_broker.rs"]
mod secure_broker;
use elastrec_stream::{
    replay, Connection, MessageFormat, PartitionId, Partitioner, ReplaySpec, StartAt, StreamError,
    StreamInput, TopicWatch, Trace,
};
use secure_broker::SecureBroker;

/// A broker of this test's own, or `None` (the test skips, counted by the test command)
/// where Tansu is not installed.
fn broker(dir: &Path) -> Option<Tansu> {
    broker_on(dir, None)
}

/// [`broker`] on a storage engine of Tansu's (`None`: the default, SQLite).
fn broker_on(dir: &Path, storage: Option<&str>) -> Option<Tansu> {
    let bin = elastrec_stream::tansu::binary_or_skip()?;
    let options = elastrec_stream::tansu::TansuOptions {
        storage: storage.map(str::to_string),
        ..Default::default()
    };
    Some(Tansu::start(&bin, &dir.join("tansu.log"), &options).unwrap())
}

/// A broker with topic `name` of `partitions` partitions, a connection to it, and the
/// directory its log (and the test's files) go to.
fn broker_with_topic(
    name: &str,
    partitions: i32,
) -> Option<(Tansu, Connection, tempfile::TempDir)> {
    broker_with_topic_on(name, partitions, None)
}

/// [`broker_with_topic`] on a storage engine of Tansu's.
fn broker_with_topic_on(
    name: &str,
    partitions: i32,
    storage: Option<&str>,
) -> Option<(Tansu, Connection, tempfile::TempDir)> {
    let dir = tempfile::tempdir().unwrap();
    let b = broker_on(dir.path(), storage)?;
    let conn = b.connection();
    elastrec_stream::create_topic(&conn, name, partitions).unwrap();
    Some((b, conn, dir))
}

fn rows(n: u32) -> Vec<RawRow> {
    (0..n)
        .map(|i| {
            let mut r = RawRow {
                label: u8::from(i % 3 == 0),
                ..RawRow::default()
            };
            for k in 0..criteo::DENSE {
                r.ints[k] = Some(i as i64 + k as i64);
            }
            for k in 0..criteo::CATEGORICAL {
                r.cats[k] = (k % 5 != 0).then_some(i ^ (k as u32) << 8);
            }
            r
        })
        .collect()
}

fn data_file(dir: &tempfile::TempDir, rows: &[RawRow]) -> PathBuf {
    let mut buf = Vec::new();
    for r in rows {
        elastrec_data::tsv::write_row(r, &mut buf);
    }
    let path = dir.path().join("day_0.tsv");
    std::fs::write(&path, buf).unwrap();
    path
}

fn spec(conn: &Connection, topic: &str, file: PathBuf, format: MessageFormat) -> ReplaySpec {
    ReplaySpec {
        conn: conn.clone(),
        topic: topic.into(),
        files: vec![file],
        schema: None,
        repeat: false,
        format,
        samples_per_message: 7,
        // Far faster than the data lasts: the replay ends when the rows do.
        trace: Trace::constant(1e6, 30.0),
        partitioner: Partitioner::RoundRobin,
        seed: 1,
    }
}

fn read_all(
    input: &StreamInput,
    p: &PartitionId,
    start: u64,
    end: u64,
    batch: usize,
) -> (Vec<f32>, Vec<u64>) {
    let mut r = input.range(p, start, end, BadRowPolicy::Fail).unwrap();
    let mut b = Batch::default();
    let mut labels = Vec::new();
    let mut positions = Vec::new();
    loop {
        let n = r.next_batch(&mut b, batch).unwrap();
        if n == 0 {
            break;
        }
        labels.extend_from_slice(&b.labels);
        positions.push(r.position().unwrap());
    }
    assert_eq!(
        r.position(),
        Some(end),
        "a finished range stands at its end"
    );
    (labels, positions)
}

#[test]
fn kafka_replayed_rows_are_read_back_by_offset_range_in_both_formats() {
    let Some((_broker, conn, dir)) = broker_with_topic("tsv", 2) else {
        return;
    };
    elastrec_stream::create_topic(&conn, "bin", 2).unwrap();
    let data = rows(101);
    let file = data_file(&dir, &data);

    let sent = replay(
        &spec(&conn, "tsv", file.clone(), MessageFormat::Tsv),
        |_| {},
    )
    .unwrap();
    assert_eq!(sent.samples, 101);
    assert_eq!(sent.per_partition, vec![51, 50]);
    let sent = replay(&spec(&conn, "bin", file, MessageFormat::Batch), |_| {}).unwrap();
    assert_eq!(sent.samples, 101);
    // 51 samples in partition 0: seven messages of 7 and one of 2.
    assert_eq!(sent.messages, 8 + 8);

    let watch = TopicWatch::new(&conn, "test", Duration::from_secs(10)).unwrap();
    let parts = watch
        .partitions(&["tsv".to_string(), "bin".to_string()])
        .unwrap();
    assert_eq!(
        parts.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["kafka:tsv/0", "kafka:tsv/1", "kafka:bin/0", "kafka:bin/1"]
    );
    let marks = watch.watermarks(&parts).unwrap();
    assert_eq!(marks, vec![(0, 51), (0, 50), (0, 8), (0, 8)]);
    assert_eq!(
        watch.start_offsets(&parts, StartAt::Latest).unwrap(),
        vec![51, 50, 8, 8]
    );
    assert_eq!(
        watch.start_offsets(&parts, StartAt::Earliest).unwrap(),
        vec![0, 0, 0, 0]
    );

    // Partition 0 holds samples 0, 2, 4, ...: a range of it, read in batches of 5.
    let tsv = StreamInput::new(&conn, "test", MessageFormat::Tsv).unwrap();
    let (labels, positions) = read_all(&tsv, &parts[0], 10, 30, 5);
    let want: Vec<f32> = (10..30).map(|k| data[2 * k].label as f32).collect();
    assert_eq!(labels, want);
    assert_eq!(positions, vec![15, 20, 25, 30]);

    // Binary messages of 7 samples read in batches of 5: the position moves only past
    // wholly delivered messages.
    let bin = StreamInput::new(&conn, "test", MessageFormat::Batch).unwrap();
    let (labels, positions) = read_all(&bin, &parts[2], 0, 8, 5);
    let want: Vec<f32> = (0..51).map(|k| data[2 * k].label as f32).collect();
    assert_eq!(labels, want);
    assert_eq!(
        &positions[..4],
        &[0, 1, 2, 2],
        "5, 10, 15, 20 samples: messages 0, 1 done"
    );
    assert_eq!(*positions.last().unwrap(), 8);
}

#[test]
fn kafka_bad_messages_are_skipped_and_counted_or_stop_at_their_offset() {
    let Some((_broker, conn, _dir)) = broker_with_topic("t", 1) else {
        return;
    };
    let good = {
        let mut b = Vec::new();
        elastrec_stream::message::encode(&rows(1), MessageFormat::Tsv, &mut b);
        b
    };
    let p = PartitionId::parse("kafka:t/0").unwrap();
    let payloads = vec![good.clone(), b"1\tnot-a-number".to_vec(), good];
    assert_eq!(elastrec_stream::produce(&conn, &p, payloads).unwrap(), 0);
    let input = StreamInput::new(&conn, "test", MessageFormat::Tsv).unwrap();

    let mut r = input.range(&p, 0, 3, BadRowPolicy::Skip).unwrap();
    let mut b = Batch::default();
    assert_eq!(r.next_batch(&mut b, 8).unwrap(), 2);
    assert_eq!(r.stats().rows_skipped, 1);
    assert!(
        r.stats().first_errors[0].starts_with("kafka:t/0@1: sample 0: field 1:"),
        "{}",
        r.stats().first_errors[0]
    );
    assert_eq!(r.position(), Some(3));

    let mut r = input.range(&p, 0, 3, BadRowPolicy::Fail).unwrap();
    let err = r.next_batch(&mut b, 8).unwrap_err();
    assert!(
        matches!(err, DataError::BadMessage { offset: 1, .. }),
        "{err}"
    );
    assert_eq!(
        b.len(),
        1,
        "the sample before the bad message stays delivered"
    );
    assert_eq!(r.position(), Some(1), "stopped at the bad message");
}

/// A multi-task job's input: two-label samples (binary version 2) reach the batch with
/// both labels; a one-label message in the same topic is skipped, naming the counts.
#[test]
fn kafka_a_two_task_input_keeps_both_labels_and_skips_one_label_samples() {
    let Some((_broker, conn, _dir)) = broker_with_topic("t", 1) else {
        return;
    };
    let two: Vec<RawRow> = rows(6)
        .into_iter()
        .enumerate()
        .map(|(i, r)| RawRow {
            extra_tasks: 1,
            extra_labels: u8::from(i % 2 == 0),
            ..r
        })
        .collect();
    let mut payloads = Vec::new();
    for part in [&two[..3], &rows(2)[..], &two[3..]] {
        let mut b = Vec::new();
        elastrec_stream::message::encode(part, MessageFormat::Batch, &mut b);
        payloads.push(b);
    }
    let p = PartitionId::parse("kafka:t/0").unwrap();
    elastrec_stream::produce(&conn, &p, payloads).unwrap();
    let input = StreamInput::new(&conn, "test", MessageFormat::Batch)
        .unwrap()
        .with_tasks(2);
    let mut r = input.range(&p, 0, 3, BadRowPolicy::Skip).unwrap();
    let mut b = Batch::default();
    assert_eq!(r.next_batch(&mut b, 16).unwrap(), 6);
    assert_eq!(b.tasks, 2);
    let want: Vec<f32> = two.iter().map(|r| f32::from(r.task_label(1))).collect();
    assert_eq!(b.task_labels, want);
    assert_eq!(r.stats().rows_skipped, 2);
    assert!(
        r.stats().first_errors[0].contains("1 label(s) and the job's model has 2 task(s)"),
        "{}",
        r.stats().first_errors[0]
    );
    assert_eq!(r.position(), Some(3));
}

#[test]
fn kafka_a_missing_topic_is_named_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let Some(b) = broker(dir.path()) else {
        return;
    };
    let conn = Connection::new(b.address());
    let watch = TopicWatch::new(&conn, "test", Duration::from_secs(5)).unwrap();
    let err = watch.partitions(&["nope".to_string()]).unwrap_err();
    assert!(matches!(err, StreamError::NoTopic { .. }), "{err}");
    assert!(err.to_string().contains("\"nope\" does not exist"), "{err}");
}

/// A range whose messages the broker no longer holds (the topic was deleted and made
/// anew under the job, as a user cleaning up might) fails naming the partition and the
/// offset, and nothing of it counts as read.
#[test]
fn kafka_a_range_whose_data_is_gone_fails_naming_the_offset() {
    let Some((_broker, conn, _dir)) = broker_with_topic("t", 1) else {
        return;
    };
    let p = PartitionId::parse("kafka:t/0").unwrap();
    elastrec_stream::produce(&conn, &p, vec![b"x".to_vec(); 10]).unwrap();
    elastrec_stream::delete_topic(&conn, "t").unwrap();
    elastrec_stream::create_topic(&conn, "t", 1).unwrap();
    elastrec_stream::produce(&conn, &p, vec![b"y".to_vec(); 2]).unwrap();

    let input = StreamInput::new(&conn, "test", MessageFormat::Tsv).unwrap();
    let mut r = input.range(&p, 5, 10, BadRowPolicy::Skip).unwrap();
    let mut b = Batch::default();
    let err = r.next_batch(&mut b, 8).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, DataError::Stream { .. }), "{text}");
    assert!(text.contains("kafka:t/0"), "{text}");
    assert!(text.contains("offset 5"), "{text}");
    assert_eq!(r.position(), Some(5), "nothing of the range counts as read");
}

/// A range that starts where the previous one ended, on the same partition, reads on with
/// the consumer's assignment (its prefetched messages kept); any other range assigns anew.
#[test]
fn kafka_consecutive_ranges_of_a_partition_share_one_assignment() {
    let Some((_broker, conn, dir)) = broker_with_topic("seq", 1) else {
        return;
    };
    let data = rows(100);
    let sent = replay(
        &spec(&conn, "seq", data_file(&dir, &data), MessageFormat::Tsv),
        |_| {},
    )
    .unwrap();
    assert_eq!(sent.samples, 100);
    let watch = TopicWatch::new(&conn, "test", Duration::from_secs(10)).unwrap();
    let p = watch.partitions(&["seq".to_string()]).unwrap().remove(0);
    let input = StreamInput::new(&conn, "test", MessageFormat::Tsv).unwrap();
    let label = |k: usize| data[k].label as f32;
    let mut got = Vec::new();
    for (start, end) in [(0, 30), (30, 60), (60, 61)] {
        got.extend(read_all(&input, &p, start, end, 8).0);
    }
    assert_eq!(got, (0..61).map(label).collect::<Vec<_>>());
    assert_eq!(input.assignments(), 1, "three ranges, one assignment");
    // A gap: assigned anew, and read from exactly there.
    let (labels, _) = read_all(&input, &p, 70, 80, 8);
    assert_eq!(labels, (70..80).map(label).collect::<Vec<_>>());
    assert_eq!(input.assignments(), 2);
    // 80.. continues 70..80; left half-read, it leaves the consumer somewhere past its
    // position, so the range after it assigns anew.
    let mut r = input.range(&p, 80, 100, BadRowPolicy::Fail).unwrap();
    let mut b = Batch::default();
    assert_eq!(r.next_batch(&mut b, 5).unwrap(), 5);
    drop(r);
    assert_eq!(input.assignments(), 2);
    let (labels, _) = read_all(&input, &p, 85, 100, 8);
    assert_eq!(labels, (85..100).map(label).collect::<Vec<_>>());
    assert_eq!(input.assignments(), 3);
}

/// Every compression Kafka has: batches replayed with each codec are read back whole and
/// in order.
#[test]
fn kafka_compressed_batches_are_read_back_with_every_codec() {
    // Tansu's memory engine keeps batches as they came; its SQLite engine decodes every
    // record and has no Snappy codec (it answers fetches with an error).
    let Some((_broker, plain, dir)) = broker_with_topic_on("gzip", 1, Some("memory://tansu/"))
    else {
        return;
    };
    let data = rows(300);
    let file = data_file(&dir, &data);
    for codec in ["gzip", "lz4", "zstd", "snappy"] {
        if codec != "gzip" {
            elastrec_stream::create_topic(&plain, codec, 1).unwrap();
        }
        // Many records to a request, each compressed batch read back by its records' own
        // offsets.
        let mut conn = plain.clone();
        conn.properties
            .insert("compression.type".into(), codec.into());
        let sent = replay(
            &spec(&conn, codec, file.clone(), MessageFormat::Batch),
            |_| {},
        )
        .unwrap();
        assert_eq!(sent.samples, 300, "{codec}");
        let p = PartitionId::parse(&format!("kafka:{codec}/0")).unwrap();
        let input = StreamInput::new(&plain, "test", MessageFormat::Batch).unwrap();
        let (labels, _) = read_all(&input, &p, 0, sent.messages, 64);
        let want: Vec<f32> = data.iter().map(|r| r.label as f32).collect();
        assert_eq!(labels, want, "{codec}");
    }
}

/// What a managed Kafka asks of a client: TLS with the server verified against a CA and a
/// client certificate, SASL SCRAM (SHA-512 and SHA-256), compressed batches. The broker is
/// Tansu with authentication required; Tansu 0.6 has no TLS listener, so stunnel
/// terminates TLS in front of it and the broker advertises stunnel's address. Every
/// message replayed through it is read back exactly once; a wrong password and a client
/// without a certificate are refused with errors that say so.
#[test]
fn kafka_tls_with_client_certificates_and_sasl_scram_carry_compressed_batches() {
    let dir = tempfile::tempdir().unwrap();
    let Some(broker) = SecureBroker::start(dir.path()) else {
        return;
    };
    let secure = |user: &str, password: &str, mechanism: &str, with_cert: bool| {
        let mut conn = broker.connection(user, password, mechanism);
        if !with_cert {
            conn.properties.remove("ssl.certificate.location");
            conn.properties.remove("ssl.key.location");
        }
        conn
    };
    let alice = secure("alice", "alice-secret", "SCRAM-SHA-512", true);
    elastrec_stream::create_topic(&alice, "secure", 2).unwrap();
    let data = rows(500);
    let file = data_file(&dir, &data);
    let sent = replay(&spec(&alice, "secure", file, MessageFormat::Batch), |_| {}).unwrap();
    assert_eq!(sent.samples, 500);

    // Read with the other user and mechanism: every message once, in each partition's order.
    let bob = secure("bob", "bob-secret", "SCRAM-SHA-256", true);
    let watch = TopicWatch::new(&bob, "test", Duration::from_secs(10)).unwrap();
    let parts = watch.partitions(&["secure".to_string()]).unwrap();
    let marks = watch.watermarks(&parts).unwrap();
    let input = StreamInput::new(&bob, "test", MessageFormat::Batch).unwrap();
    let mut got = 0;
    for (p, (low, high)) in parts.iter().zip(marks) {
        assert_eq!(low, 0);
        let (labels, positions) = read_all(&input, p, 0, high, 32);
        let i = p.partition as usize;
        let want: Vec<f32> = data
            .iter()
            .skip(i)
            .step_by(2)
            .map(|r| r.label as f32)
            .collect();
        assert_eq!(labels, want, "{p}");
        assert_eq!(positions.last().copied(), Some(high));
        got += labels.len();
    }
    assert_eq!(got, 500);

    let wrong = secure("alice", "not-her-password", "SCRAM-SHA-512", true);
    let err = TopicWatch::new(&wrong, "test", Duration::from_secs(10))
        .unwrap()
        .partitions(&["secure".to_string()])
        .unwrap_err();
    assert!(matches!(err, StreamError::Client { .. }), "{err}");
    assert!(err.to_string().contains("SASL"), "{err}");

    let no_cert = secure("alice", "alice-secret", "SCRAM-SHA-512", false);
    let err = TopicWatch::new(&no_cert, "test", Duration::from_secs(10))
        .unwrap()
        .partitions(&["secure".to_string()])
        .unwrap_err();
    assert!(
        !matches!(err, StreamError::NoTopic { .. }),
        "refused: {err}"
    );
}

/// A job with named features reads JSON messages: one object or an array of them per
/// message, keys, lists and labels by the files' rules; a sample that does not fit the
/// schema is skipped naming its column (or stops the range at its offset), a message that
/// is not JSON is a framing error.
#[test]
fn kafka_json_messages_of_named_features_fill_jagged_batches() {
    use elastrec_data::schema::string_key;
    use elastrec_data::{FeatureKind, FeatureSpec, Schema};
    let Some((_broker, conn, _dir)) = broker_with_topic("t", 1) else {
        return;
    };
    let mut hist = FeatureSpec::new("hist", FeatureKind::Sequence);
    hist.max_len = Some(2);
    hist.table = Some("item".into());
    let schema = std::sync::Arc::new(Schema {
        labels: vec!["click".into()],
        weight: None,
        features: vec![
            FeatureSpec::new("price", FeatureKind::Dense),
            FeatureSpec::new("item", FeatureKind::Categorical),
            hist,
        ],
        ..Schema::default()
    });
    let p = PartitionId::parse("kafka:t/0").unwrap();
    let payloads: Vec<Vec<u8>> = [
        r#"{"click": 1, "price": 2.5, "item": "x", "hist": ["a", "b", "c"]}"#,
        r#"[{"click": 0, "price": null, "item": 7, "hist": []},
            {"click": 1, "price": 1, "item": "y", "hist": "oops"},
            {"click": true, "price": 3, "item": null, "hist": null}]"#,
        "not json",
        r#"{"click": 0, "price": 4, "item": "z", "hist": [9]}"#,
    ]
    .iter()
    .map(|m| m.as_bytes().to_vec())
    .collect();
    assert_eq!(elastrec_stream::produce(&conn, &p, payloads).unwrap(), 0);
    let input = StreamInput::new(&conn, "test", MessageFormat::Json)
        .unwrap()
        .with_schema(Some(schema.clone()));

    let mut r = input.range(&p, 0, 4, BadRowPolicy::Skip).unwrap();
    let mut b = Batch::default();
    assert_eq!(r.next_batch(&mut b, 16).unwrap(), 4);
    assert_eq!(b.labels, [1.0, 0.0, 1.0, 0.0]);
    assert_eq!(b.dense, [2.5, 0.0, 3.0, 4.0]);
    assert_eq!(
        b.sparse,
        [
            string_key(b"x"),
            7,
            elastrec_data::schema::NULL_KEY,
            string_key(b"z")
        ]
    );
    assert_eq!(
        b.bags[0].row(0),
        [string_key(b"b"), string_key(b"c")],
        "a sequence keeps its newest"
    );
    assert!(b.bags[0].row(1).is_empty() && b.bags[0].row(2).is_empty());
    assert_eq!(b.bags[0].row(3), [9]);
    let errors = &r.stats().first_errors;
    assert_eq!(r.stats().rows_skipped, 2, "{errors:?}");
    assert!(
        errors[0].starts_with("kafka:t/0@1: sample 1: json: feature `hist`: must be an array"),
        "{errors:?}"
    );
    assert!(
        errors[1].starts_with("kafka:t/0@2: sample 0: frame:"),
        "{errors:?}"
    );
    assert_eq!(r.position(), Some(4));

    let mut r = input.range(&p, 0, 4, BadRowPolicy::Fail).unwrap();
    let err = r.next_batch(&mut b, 16).unwrap_err();
    assert!(
        matches!(err, DataError::BadMessage { offset: 1, .. }),
        "{err}"
    );
    assert_eq!(b.len(), 1, "the message before the bad one stays delivered");
    assert_eq!(r.position(), Some(1), "stopped at the bad message");

    // Without named features a JSON input says what it needs.
    let bare = StreamInput::new(&conn, "test", MessageFormat::Json).unwrap();
    let err = bare
        .range(&p, 0, 1, BadRowPolicy::Fail)
        .unwrap()
        .next_batch(&mut b, 4)
        .unwrap_err();
    assert!(err.to_string().contains("named features"), "{err}");
}
