//! Which layout of the job's parameter servers a server serves, and where it stands in a
//! re-sharding (see `reshard.rs` and the service comment in `ps.proto`).

use std::ops::Range;
use std::sync::Arc;

use elastrec_proto::ps::LayoutState;

use crate::error::PsError;

/// A server's place in a layout: the layout's version, this server's index and the number
/// of servers, and what that gives it to hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Version of the layout (0: the job's first one).
    pub version: u64,
    /// This server's index.
    pub index: u32,
    /// Servers of the layout.
    pub count: u32,
    /// This server's slice of the flat dense vector.
    pub range: Range<usize>,
    /// Embedding rows this server holds (every table's shard).
    pub rows_held: u64,
}

/// The layout a re-sharding moves to, as the servers of the old layout know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// Version of the new layout.
    pub version: u64,
    /// Its number of servers.
    pub count: u32,
}

/// Where a server stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Serves requests of its layout. `precopy`: a re-sharding to that layout is copying
    /// rows to the new servers ahead of its freeze (rows updated since are sent again).
    Serving {
        /// The layout being pre-copied to.
        precopy: Option<Target>,
    },
    /// Frozen by a re-sharding to the target: refuses requests until commit or abort.
    Frozen(Target),
    /// Started for its layout, which is not committed yet: receives rows, serves nothing.
    Joining,
    /// Not part of the layout of this version (committed): refuses everything.
    Retired {
        /// The layout it is not part of.
        layout: u64,
    },
}

impl Phase {
    /// The phase as the wire names it.
    pub fn state(&self) -> LayoutState {
        match self {
            Phase::Serving { .. } => LayoutState::Serving,
            Phase::Frozen(_) => LayoutState::Frozen,
            Phase::Joining => LayoutState::Joining,
            Phase::Retired { .. } => LayoutState::Retired,
        }
    }
}

/// A copy of a server's layout and phase, readable without the state lock (the lock holder
/// that changes them updates the copy before releasing the lock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutView {
    /// The layout served (or, for a joining server, the one it joins).
    pub layout: Layout,
    /// Where the server stands.
    pub phase: Phase,
    /// The newest committed layout whose addresses this server knows (from its commit):
    /// named when it refuses a request of an older layout.
    pub known: Option<(u64, Arc<Vec<String>>)>,
}

impl LayoutView {
    /// The layout a server moves to, when it moves (0 otherwise).
    pub fn next_version(&self) -> u64 {
        match self.phase {
            Phase::Serving { precopy: Some(t) } | Phase::Frozen(t) => t.version,
            Phase::Joining => self.layout.version,
            _ => 0,
        }
    }

    /// Accepts a pull or push routed by layout `request` only when the server serves it.
    pub fn check(&self, request: u64) -> Result<(), PsError> {
        let (l, i) = (self.layout.version, self.layout.index);
        let detail = match self.phase {
            Phase::Serving { .. } if request == l => return Ok(()),
            Phase::Serving { .. } => {
                format!("PS {i} serves layout {l}; the request was routed by layout {request}")
            }
            Phase::Frozen(t) => format!(
                "PS {i} is moving from layout {l} to layout {} ({} servers); the request was \
                 routed by layout {request}",
                t.version, t.count
            ),
            Phase::Joining => format!(
                "PS {i} joins layout {l}, which is not committed yet; the request was routed by \
                 layout {request}"
            ),
            Phase::Retired { layout } => format!(
                "PS {i} is not part of layout {layout} and serves nothing; the request was \
                 routed by layout {request}"
            ),
        };
        let known = self.known.clone().filter(|(v, _)| *v > request);
        Err(PsError::LayoutRefused { detail, known })
    }
}

/// A fixed-size set of indices (rows received, rows dirtied, dense values received).
#[derive(Debug, Clone, Default)]
pub struct Bitset {
    words: Vec<u64>,
    len: usize,
    ones: usize,
}

impl Bitset {
    /// `len` indices, none set.
    pub fn new(len: usize) -> Self {
        Self {
            words: vec![0; len.div_ceil(64)],
            len,
            ones: 0,
        }
    }

    /// Indices the set can hold.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the set can hold no index.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Indices set.
    pub fn ones(&self) -> usize {
        self.ones
    }

    /// Sets `i` (which must be `< len`); true when it was not set.
    pub fn insert(&mut self, i: usize) -> bool {
        let (w, b) = (i / 64, 1u64 << (i % 64));
        let new = self.words[w] & b == 0;
        self.words[w] |= b;
        self.ones += usize::from(new);
        new
    }

    /// Clears `i` (which must be `< len`).
    pub fn remove(&mut self, i: usize) {
        let (w, b) = (i / 64, 1u64 << (i % 64));
        self.ones -= usize::from(self.words[w] & b != 0);
        self.words[w] &= !b;
    }

    /// Whether `i` is set.
    pub fn contains(&self, i: usize) -> bool {
        self.words[i / 64] & (1u64 << (i % 64)) != 0
    }

    /// The first index not set, if any.
    pub fn first_missing(&self) -> Option<usize> {
        let w = self.words.iter().position(|&w| w != u64::MAX)?;
        let i = w * 64 + self.words[w].trailing_ones() as usize;
        (i < self.len).then_some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitset_counts_and_finds_the_gaps() {
        let mut b = Bitset::new(130);
        assert_eq!(b.first_missing(), Some(0));
        for i in 0..130 {
            assert!(b.insert(i));
        }
        assert!(!b.insert(7), "already set");
        assert_eq!((b.ones(), b.first_missing()), (130, None));
        b.remove(129);
        b.remove(129);
        assert_eq!((b.ones(), b.first_missing()), (129, Some(129)));
        assert!(!b.contains(129) && b.contains(128));
        assert_eq!(Bitset::new(0).first_missing(), None);
    }

    #[test]
    fn only_the_served_layout_is_accepted() {
        let layout = Layout {
            version: 3,
            index: 1,
            count: 2,
            range: 0..10,
            rows_held: 5,
        };
        let mut v = LayoutView {
            layout,
            phase: Phase::Serving { precopy: None },
            known: Some((3, Arc::new(vec!["a:1".into(), "b:2".into()]))),
        };
        assert!(v.check(3).is_ok());
        assert!(matches!(
            v.check(2),
            Err(PsError::LayoutRefused { detail, known: Some((3, _)) }) if detail.contains("layout 2")
        ));
        assert!(
            matches!(v.check(4), Err(PsError::LayoutRefused { known: None, .. })),
            "an older layout is not named"
        );
        v.phase = Phase::Serving {
            precopy: Some(Target {
                version: 4,
                count: 4,
            }),
        };
        assert!(v.check(3).is_ok(), "pre-copy still serves");
        v.phase = Phase::Frozen(Target {
            version: 4,
            count: 4,
        });
        assert!(v.check(3).is_err());
        assert_eq!(v.next_version(), 4);
        v.phase = Phase::Retired { layout: 4 };
        assert!(v.check(4).is_err());
    }
}
