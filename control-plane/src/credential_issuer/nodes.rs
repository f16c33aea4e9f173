//! The Node watch that `mode: auto` decides by: whether the cluster has control-plane Nodes.

use super::*;

/// What the Node watch knows about control-plane Nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum NodeState {
    /// The first list has not completed.
    Unknown,
    /// Listing Nodes failed before any list completed.
    Error(String),
    /// The Nodes were listed.
    Known {
        /// Whether there is any Node.
        any: bool,
        /// Whether any Node has a control-plane role label.
        control_plane: bool,
    },
}

/// Whether a Node label marks a control-plane Node (Pinniped's `isControlPlaneNodeRole`).
pub(super) fn is_control_plane_label(key: &str, value: &str) -> bool {
    key == "node-role.kubernetes.io/control-plane"
        || key == "node-role.kubernetes.io/master"
        || (key == "kubernetes.io/node-role" && (value == "control-plane" || value == "master"))
}

pub(super) fn is_control_plane_node(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels.is_some_and(|labels| labels.iter().any(|(k, v)| is_control_plane_label(k, v)))
}

/// Wakes `notify` on every change a watch reports, until the watch ends.
pub(super) async fn trigger_on<S, K>(events: S, notify: Arc<Notify>, what: &'static str)
where
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(_) | Event::Delete(_) | Event::InitDone) => notify.notify_one(),
            Ok(Event::Init | Event::InitApply(_)) => {}
            Err(error) => tracing::warn!(%error, "watching {what} for the CredentialIssuer controller"),
        }
    }
}

/// Keeps `state` up to date with the Nodes' control-plane labels, waking `notify` when it changes.
pub(super) async fn watch_nodes(client: Client, state: watch::Sender<NodeState>, notify: Arc<Notify>) {
    let events = watcher(
        Api::<PartialObjectMeta<Node>>::all(client),
        watcher::Config::default(),
    )
    .default_backoff();
    let mut events = std::pin::pin!(events);
    let mut nodes: BTreeMap<String, bool> = BTreeMap::new();
    let mut listing: BTreeMap<String, bool> = BTreeMap::new();
    let mut listed = false;
    while let Some(event) = events.next().await {
        let name_and_role = |meta: &ObjectMeta| {
            (
                meta.name.clone().unwrap_or_default(),
                is_control_plane_node(meta.labels.as_ref()),
            )
        };
        match event {
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitApply(node)) => {
                let (name, role) = name_and_role(&node.metadata);
                listing.insert(name, role);
                continue;
            }
            Ok(Event::InitDone) => {
                nodes = std::mem::take(&mut listing);
                listed = true;
            }
            Ok(Event::Apply(node)) => {
                let (name, role) = name_and_role(&node.metadata);
                nodes.insert(name, role);
            }
            Ok(Event::Delete(node)) => {
                nodes.remove(&node.metadata.name.unwrap_or_default());
            }
            Err(error) => {
                tracing::warn!(%error, "watching Nodes for the CredentialIssuer controller");
                if !listed {
                    let message = format!("error fetching nodes: {error}");
                    if state.send_if_modified(|s| replace(s, NodeState::Error(message))) {
                        notify.notify_one();
                    }
                }
                continue;
            }
        }
        if !listed {
            continue;
        }
        let known = NodeState::Known {
            any: !nodes.is_empty(),
            control_plane: nodes.values().any(|role| *role),
        };
        if state.send_if_modified(|s| replace(s, known)) {
            notify.notify_one();
        }
    }
}
