//! The one admission step of a GC: every refusal of a whole GC is counted here (`dipamctl
//! status`'s `gc_refused`, `dipam_gc_refused_total`), and the empty-list rule lives here. A
//! valid list that names nothing would free every pod of the network (calico#5044: a bad
//! list once freed every healthy pod), so it is refused unless dipamd runs with
//! --gc-allow-empty; a list dipamd cannot read is refused whole, since guessing an entry
//! stale could free a running pod.

use super::Gc;
use crate::{
    l1_leaves::error::{InputError, ShimError},
    l1_leaves::events::{Event, Events},
};

/// A GC of `network` on its way in: what refuses it, and counts the refusal.
pub struct Admission<'a> {
    gc: &'a Gc,
    events: &'a Events,
    network: &'a str,
}

impl<'a> Admission<'a> {
    pub fn new(gc: &'a Gc, events: &'a Events, network: &'a str) -> Self {
        Self {
            gc,
            events,
            network,
        }
    }

    /// The GC refused whole with `e`: counted, and passed on.
    pub fn refuse(&self, e: ShimError) -> ShimError {
        self.gc
            .stats
            .refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.events.emit(Event::GcRefused);
        e
    }

    /// A valid list as read: one entry dipamd cannot read refuses the GC.
    pub fn input<T>(&self, read: Result<T, InputError>) -> Result<T, ShimError> {
        read.map_err(|e| self.refuse(ShimError::GcInput(e)))
    }

    /// The empty-list rule: `list` naming nothing is refused, unless --gc-allow-empty.
    /// `names` says how the caller's list named nothing, `fix` what the caller can do.
    pub fn non_empty(
        &self,
        list: Vec<(String, String)>,
        names: &str,
        fix: &str,
    ) -> Result<Vec<(String, String)>, ShimError> {
        if !list.is_empty() || self.gc.policy.allow_empty {
            return Ok(list);
        }
        Err(self.refuse(ShimError::GcRefused {
            network: self.network.to_owned(),
            reason: format!("{names}, which would free every pod of the network{fix}"),
        }))
    }
}
