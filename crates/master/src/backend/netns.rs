//! Nodes of the local backend on hosts of their own network: each node process enters a
//! Linux network namespace (`engine.local.netns`) before it runs a single instruction of
//! the node, so it has its own interfaces, addresses and routes, and every byte it sends
//! a peer crosses a network stack. The namespaces are made beforehand (`ip netns add`,
//! which keeps them as files under `/run/netns`); the master only enters them.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;

use elastrec_job::resources::netns_name;

use crate::job::Node;
use crate::launch::role_name;

/// Where `ip netns` keeps the namespaces it names.
const NETNS_DIR: &str = "/run/netns";

/// The namespaces of a job's nodes: `engine.local.netns`'s template.
#[derive(Debug, Clone)]
pub struct NetnsPlacement {
    template: String,
}

/// A node's namespace, opened: held until its process has entered it.
#[derive(Debug)]
pub struct OpenNetns {
    file: File,
}

impl OpenNetns {
    /// The descriptor a child enters with [`enter`].
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl NetnsPlacement {
    /// The placement `template` describes; `None` when it is empty (nodes share the
    /// master's network).
    pub fn new(template: &str) -> Option<Self> {
        (!template.is_empty()).then(|| Self {
            template: template.to_string(),
        })
    }

    /// The namespace of `node`.
    pub fn name(&self, node: &Node) -> String {
        netns_name(&self.template, role_name(node.role), node.index)
    }

    /// Opens `node`'s namespace, or says which one is missing and how to make it.
    pub fn open(&self, node: &Node) -> anyhow::Result<OpenNetns> {
        let name = self.name(node);
        let path = PathBuf::from(NETNS_DIR).join(&name);
        let file = File::open(&path).map_err(|e| {
            anyhow::anyhow!(
                "{} {}: its network namespace `{name}` (engine.local.netns) cannot be \
                 opened at {}: {e}; make it first with `ip netns add {name}` (as root)",
                role_name(node.role),
                node.index,
                path.display()
            )
        })?;
        Ok(OpenNetns { file })
    }
}

/// Moves the calling process into the network namespace `fd`. Called in a child between
/// fork and exec: it makes one system call and allocates nothing.
pub fn enter(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: setns(2) on a descriptor the parent opened and keeps open until the child
    // has exec'd; CLONE_NEWNET only switches the network namespace.
    if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Role;

    #[test]
    fn each_node_is_placed_by_its_role_and_index_and_a_missing_namespace_is_named() {
        let p = NetnsPlacement::new("er-{role}{index}").unwrap();
        let ps = Node::pending(7, Role::Ps, 1);
        let worker = Node::pending(9, Role::Worker, 3);
        assert_eq!(p.name(&ps), "er-ps1");
        assert_eq!(p.name(&worker), "er-worker3");
        assert!(NetnsPlacement::new("").is_none());
        let missing = NetnsPlacement::new("elastrec-no-such-namespace-{index}").unwrap();
        let err = missing.open(&worker).unwrap_err().to_string();
        assert!(
            err.contains("worker 3")
                && err.contains("elastrec-no-such-namespace-3")
                && err.contains("ip netns add elastrec-no-such-namespace-3"),
            "{err}"
        );
    }
}
