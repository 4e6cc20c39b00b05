//! A change of the PS count in the node table: the new servers start beside the old
//! ones, and the layout commits or rolls back (the master's `reshard` drives the protocol).

use super::*;

impl Job {
    /// Restores the layout after a master restart (its PS count is the policy's).
    pub fn set_layout(&mut self, version: u64, num_ps: u32) {
        self.layout_version = version;
        self.policy.num_ps = num_ps;
    }

    /// The change of the PS layout in progress, if any.
    pub fn reshard(&self) -> Option<&Reshard> {
        self.reshard.as_ref()
    }

    /// True for a PS started for a layout that is not committed yet.
    pub fn is_joining(&self, id: u32) -> bool {
        self.reshard
            .as_ref()
            .is_some_and(|r| r.joining.contains(&id))
    }

    /// Starts changing the PS count to `num_ps`: launches the servers of the new layout
    /// that do not exist yet (they join empty and receive their rows). Refused while the
    /// job is not training, a PS is being recovered or another change is in progress.
    pub fn begin_reshard(&mut self, num_ps: u32, cx: &mut impl Context) -> Result<u64, String> {
        if self.phase != Phase::Training {
            return Err("the job is no longer training".into());
        }
        if self.reshard.is_some() {
            return Err("a change of the PS count is already in progress".into());
        }
        if self.recovering() {
            return Err(
                "a parameter server is being recovered; change the PS count once every PS runs"
                    .into(),
            );
        }
        if num_ps == 0 || num_ps > 64 {
            return Err(format!("{num_ps} PS: must be between 1 and 64"));
        }
        if num_ps == self.policy.num_ps {
            return Err(format!("the job already runs {num_ps} PS"));
        }
        let version = self.layout_version + 1;
        let joining = (self.policy.num_ps..num_ps)
            .map(|i| self.launch(Role::Ps, i, 0, cx))
            .collect();
        self.reshard = Some(Reshard {
            version,
            num_ps,
            joining,
        });
        Ok(version)
    }

    /// The new layout's servers by index once every joining one has registered
    /// (`Err` when one of them died).
    pub fn reshard_targets(&self) -> Result<Option<Vec<String>>, String> {
        let Some(r) = &self.reshard else {
            return Err("no change of the PS count in progress".into());
        };
        let mut addrs = vec![String::new(); r.num_ps as usize];
        for n in self.nodes.values().filter(|n| n.role == Role::Ps) {
            let joining = r.joining.contains(&n.id);
            if joining && !n.state.is_live() {
                return Err(format!("PS {} (node {}) died while joining", n.index, n.id));
            }
            let member = joining || (n.index < self.policy.num_ps && n.index < r.num_ps);
            if member && n.state == NodeState::Running && n.index < r.num_ps {
                addrs[n.index as usize] = n.addr.clone();
            }
        }
        Ok(addrs.iter().all(|a| !a.is_empty()).then_some(addrs))
    }

    /// The new layout is committed on every server: it is in force from now; servers
    /// beyond the new count retire (their processes are stopped).
    pub fn commit_reshard(&mut self, cx: &mut impl Context) {
        let Some(r) = self.reshard.take() else { return };
        let retired: Vec<u32> = self
            .nodes
            .values()
            .filter(|n| n.role == Role::Ps && n.state.is_live() && n.index >= r.num_ps)
            .map(|n| n.id)
            .collect();
        for id in retired {
            let n = self.nodes.get_mut(&id).expect("node");
            n.state = NodeState::Exited;
            let n = n.clone();
            cx.kill(&n);
            cx.persist(Change::Node(n));
        }
        self.policy.num_ps = r.num_ps;
        self.layout_version = r.version;
        cx.persist(Change::Meta(
            "ps_layout",
            serde_json::to_string(&(r.version, r.num_ps)).expect("serializes"),
        ));
    }

    /// After a master restart: PS processes of a layout that was never committed (index
    /// beyond the count in force) are stopped. The old servers, which may have been frozen
    /// by it, are told to abort it by the caller.
    pub fn drop_uncommitted_servers(&mut self, cx: &mut impl Context) {
        let stale: Vec<u32> = self
            .nodes
            .values()
            .filter(|n| n.role == Role::Ps && n.state.is_live() && n.index >= self.policy.num_ps)
            .map(|n| n.id)
            .collect();
        for id in stale {
            let n = self.nodes.get_mut(&id).expect("node");
            n.state = NodeState::Exited;
            let n = n.clone();
            cx.kill(&n);
            cx.persist(Change::Node(n));
        }
    }

    /// The change failed: the joining servers are stopped, the old layout stays.
    pub fn abort_reshard(&mut self, cx: &mut impl Context) {
        let Some(r) = self.reshard.take() else { return };
        for id in r.joining {
            if let Some(n) = self.nodes.get_mut(&id) {
                if n.state.is_live() {
                    n.state = NodeState::Exited;
                    let n = n.clone();
                    cx.kill(&n);
                    cx.persist(Change::Node(n));
                }
            }
        }
    }
}
