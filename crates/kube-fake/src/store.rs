//! The fake's objects: pods and Secrets by namespace and name, one resource version
//! counter for every change, and the history of pod changes that watches replay.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

/// A key: namespace and name.
pub type Key = (String, String);

/// One change of a pod, as a watch reports it.
#[derive(Debug, Clone)]
pub struct PodEvent {
    /// The resource version the change produced.
    pub version: u64,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    /// The pod after the change (before it, for a deletion).
    pub pod: Pod,
}

/// Everything the fake API server stores.
#[derive(Default)]
pub struct Store {
    /// The last resource version handed out.
    pub version: u64,
    /// Pods.
    pub pods: BTreeMap<Key, Pod>,
    /// Secrets.
    pub secrets: BTreeMap<Key, Secret>,
    /// Every pod change since the start (watches replay from any version).
    pub history: Vec<PodEvent>,
    /// Every pod ever created, in order (tests count relaunches with it).
    pub created: Vec<Pod>,
    next_uid: u64,
}

impl Store {
    /// Stamps a new object: uid, resource version, creation time.
    pub fn stamp_new(&mut self, meta: &mut ObjectMeta) {
        self.next_uid += 1;
        meta.uid = Some(format!("00000000-0000-4000-8000-{:012x}", self.next_uid));
        meta.creation_timestamp = Some(Time(now()));
        self.version += 1;
        meta.resource_version = Some(self.version.to_string());
    }

    /// Records a pod change (the pod's resource version is set here).
    pub fn pod_changed(&mut self, kind: &'static str, mut pod: Pod) -> PodEvent {
        if kind != "ADDED" {
            self.version += 1;
        }
        pod.metadata.resource_version = Some(self.version.to_string());
        let key = key_of(&pod.metadata);
        if kind == "DELETED" {
            self.pods.remove(&key);
        } else {
            self.pods.insert(key, pod.clone());
        }
        let event = PodEvent {
            version: self.version,
            kind,
            pod,
        };
        self.history.push(event.clone());
        event
    }

    /// Pods whose owner (by uid) no longer exists: the garbage collector deletes them.
    pub fn orphans(&self) -> Vec<Key> {
        let exists = |uid: &str| {
            self.secrets
                .values()
                .any(|s| s.metadata.uid.as_deref() == Some(uid))
                || self
                    .pods
                    .values()
                    .any(|p| p.metadata.uid.as_deref() == Some(uid))
        };
        self.pods
            .iter()
            .filter(|(_, p)| {
                p.metadata
                    .owner_references
                    .as_ref()
                    .is_some_and(|owners| owners.iter().any(|o| !exists(&o.uid)))
            })
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// Namespace and name of an object.
pub fn key_of(meta: &ObjectMeta) -> Key {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// Now, to the second, as Kubernetes timestamps are.
pub fn now() -> k8s_openapi::jiff::Timestamp {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default()
}

/// A parsed `labelSelector`: `k=v`, `k==v`, `k!=v`, `k` and `!k`, comma-separated.
#[derive(Debug, Clone, Default)]
pub struct Selector(Vec<(String, Requirement)>);

#[derive(Debug, Clone)]
enum Requirement {
    Equals(String),
    Differs(String),
    Exists,
    Absent,
}

impl Selector {
    /// Parses a selector (empty: everything).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let req = if let Some((k, v)) = part.split_once("!=") {
                (
                    k.trim().to_string(),
                    Requirement::Differs(v.trim().to_string()),
                )
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (
                    k.trim().to_string(),
                    Requirement::Equals(v.trim().to_string()),
                )
            } else if let Some(k) = part.strip_prefix('!') {
                (k.trim().to_string(), Requirement::Absent)
            } else if part.contains(' ') || part.contains('(') {
                return Err(format!("unsupported label selector `{part}` (set-based)"));
            } else {
                (part.to_string(), Requirement::Exists)
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// True when `meta`'s labels satisfy every requirement.
    pub fn matches(&self, meta: &ObjectMeta) -> bool {
        let empty = BTreeMap::new();
        let labels = meta.labels.as_ref().unwrap_or(&empty);
        self.0.iter().all(|(k, r)| match r {
            Requirement::Equals(v) => labels.get(k) == Some(v),
            Requirement::Differs(v) => labels.get(k) != Some(v),
            Requirement::Exists => labels.contains_key(k),
            Requirement::Absent => !labels.contains_key(k),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_match_like_the_api_server() {
        let meta = ObjectMeta {
            labels: Some([("a".to_string(), "1".to_string())].into()),
            ..Default::default()
        };
        let m = |s: &str| Selector::parse(s).unwrap().matches(&meta);
        assert!(m("") && m("a=1") && m("a==1") && m("a") && m("b!=2") && m("!b"));
        assert!(!m("a=2") && !m("a!=1") && !m("b") && !m("a=1,b"));
        assert!(Selector::parse("a in (1,2)").is_err());
    }
}
