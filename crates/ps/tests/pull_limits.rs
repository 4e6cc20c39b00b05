//! Limits on what a pull may make the server allocate.
//!
//! The client chooses how many rows a pull names; the reply holds `dim` floats for each. A
//! request of a few MiB can therefore claim a reply of gigabytes. The server must refuse a
//! pull whose reply cannot fit in `cluster.max_message_bytes` before it allocates anything
//! for the reply. The allocations are counted by a global allocator that forwards to the
//! system allocator and counts, per thread, the bytes asked for.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;
use std::sync::Arc;

use elastrec_job::config::JobConfig;
use elastrec_proto::ps::PullRequest;
use elastrec_ps::{PsError, PsShard};
use elastrec_rpc as rpc;

struct CountingAllocator;

thread_local! {
    /// Bytes this thread asked the allocator for so far (never decremented).
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

fn count(bytes: usize) {
    // `try_with`: the allocator also runs while thread-local storage is torn down.
    let _ = ALLOCATED.try_with(|a| a.set(a.get().saturating_add(bytes)));
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches only
// a thread-local `Cell` without a destructor, which never allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size.saturating_sub(layout.size()));
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Runs `f` and returns its result with the bytes this thread allocated meanwhile.
fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATED.with(Cell::get);
    let out = f();
    (out, ALLOCATED.with(Cell::get) - before)
}

/// One server holding every row; 64 floats a row (256 bytes); the default 64 MiB limit.
fn shard() -> PsShard {
    let job = JobConfig::from_toml(
        "[model]\nbottom_mlp = [8, 64]\ntop_mlp = [8, 1]\nembedding_dim = 64\ntable_rows = 100\n",
        Path::new("job.toml"),
    )
    .unwrap();
    assert_eq!(job.cluster.max_message_bytes, 64 << 20);
    PsShard::new(&job, 0, 1).unwrap()
}

/// Valid rows, `n` of them: only the size of the reply can be wrong.
fn pull_of(n: usize) -> PullRequest {
    PullRequest {
        version: rpc::version(),
        tables: vec![0; n],
        rows: vec![7; n],
        want_dense: false,
        layout_version: 0,
        packed: false,
    }
}

#[test]
fn an_oversized_pull_is_refused_before_its_reply_is_allocated() {
    let ps = shard();
    // 2^20 rows claim a 256 MiB reply (a request of about 2 MiB on the wire).
    let huge = pull_of(1 << 20);
    let (refused, bytes) = allocated_by(|| ps.pull(&huge));
    match refused {
        Err(PsError::ReplyTooLarge {
            rows,
            dim,
            bytes: reply,
            limit,
            ..
        }) => {
            assert_eq!((rows, dim, limit), (1 << 20, 64, 64 << 20));
            assert!(reply > 256 << 20, "reply estimate {reply}");
        }
        other => panic!("expected ReplyTooLarge, got {other:?}"),
    }
    assert!(
        bytes < 4096,
        "the refused pull allocated {bytes} bytes (its reply would be 256 MiB)"
    );
    // The counter does see a pull's reply: one that fits allocates at least its values.
    let fits = pull_of(1 << 16);
    let (reply, bytes) = allocated_by(|| ps.pull(&fits));
    assert_eq!(reply.unwrap().values.len(), (1 << 16) * 64);
    assert!(bytes >= (1 << 16) * 64 * 4, "{bytes}");
}

/// Through gRPC the refusal is `RESOURCE_EXHAUSTED` with the sizes in the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_refusal_reaches_the_client_as_resource_exhausted() {
    let ps = Arc::new(shard());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let token = "pulltoken";
    let server = tokio::spawn(elastrec_ps::service::serve(
        ps,
        listener,
        token.into(),
        64 << 20,
    ));
    let mut client =
        rpc::ps_client(&addr, token, 64 << 20, std::time::Duration::from_secs(30)).unwrap();
    let status = client.pull(pull_of(1 << 20)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
    assert!(
        status.message().contains("1048576 rows") && status.message().contains("67108864-byte"),
        "{}",
        status.message()
    );
    let ok = client.pull(pull_of(3)).await.unwrap().into_inner();
    assert_eq!(ok.values.len(), 3 * 64);
    server.abort();
}
