//! A [`Context`] that records what the state machine asked for, on a clock the caller
//! moves: the state machine's tests, the store's, and any crash or race scenario run
//! without processes.

use super::{Change, Context, Event, Node};

/// Records every change, launch, kill, event and probe; `now` is the clock.
#[derive(Debug, Default)]
pub struct Recorder {
    /// The clock, ms.
    pub now: u64,
    /// Changes to persist, in order.
    pub changes: Vec<Change>,
    /// Nodes launched, in order.
    pub launched: Vec<Node>,
    /// Ids of the nodes killed, in order.
    pub killed: Vec<u32>,
    /// Events logged, in order.
    pub events: Vec<Event>,
    /// Ids of the nodes probed, in order.
    pub probed: Vec<u32>,
}

impl Context for Recorder {
    fn now_ms(&self) -> u64 {
        self.now
    }
    fn persist(&mut self, c: Change) {
        self.changes.push(c);
    }
    fn launch(&mut self, n: &Node) {
        self.launched.push(n.clone());
    }
    fn kill(&mut self, n: &Node) {
        self.killed.push(n.id);
    }
    fn event(&mut self, e: Event) {
        self.events.push(e);
    }
    fn probe(&mut self, n: &Node) {
        self.probed.push(n.id);
    }
}
