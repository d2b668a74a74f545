//! The store's reads and commits (the [`Store`] methods): from sled, with the commits the
//! applier has not written there yet laid over them, and each commit journaled first.

use std::ops::{Bound, ControlFlow};

use super::*;

/// Entries per page of [`Store::visit_prefix`]: a few hundred KiB of records at most.
const VISIT_PAGE: usize = 256;

impl Inner {
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        for _ in 0..TORN_RETRIES {
            if let Some(pending) = lock(&self.pending)?.get(tree, key) {
                return Ok(pending);
            }
            let engine = self.engine()?;
            let engine = engine.as_ref().expect("checked by engine()");
            let Some(value) = engine.tree(tree).get(key).map_err(self.sled_err())? else {
                return Ok(None);
            };
            if let Ok(value) = engine.resolve(&self.dir, value)? {
                return Ok(Some(value));
            }
        }
        Err(kept_changing(&self.dir))
    }

    fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<KeyValue>, StoreError> {
        for _ in 0..TORN_RETRIES {
            // The overlay first: a commit applied meanwhile is then in sled, with the same
            // value.
            let overlay = lock(&self.pending)?.overlay(tree, prefix);
            if let Ok(entries) = self.scan_under(tree, prefix, overlay)? {
                return Ok(entries);
            }
        }
        Err(kept_changing(&self.dir))
    }

    /// [`Store::visit_prefix`]: [`Inner::visit_after`] from the prefix's start to its end.
    fn visit_prefix(
        &self,
        tree: Tree,
        prefix: &[u8],
        visit: &mut Visit<'_>,
    ) -> Result<(), StoreError> {
        self.visit_after(tree, prefix, None, &mut |k, v| {
            visit(k, v).map(|()| ControlFlow::Continue(()))
        })
    }

    /// [`Store::visit_after`]: a page of [`VISIT_PAGE`] entries at a time, each read as
    /// [`Inner::scan_prefix`] reads the whole prefix (the overlay first, then sled), until
    /// `visit` breaks.
    fn visit_after(
        &self,
        tree: Tree,
        prefix: &[u8],
        after: Option<&[u8]>,
        visit: &mut VisitUntil<'_>,
    ) -> Result<(), StoreError> {
        let mut from = crate::store::start_after(prefix, after);
        loop {
            let (page, next) = self.page(tree, prefix, &from)?;
            for (k, v) in &page {
                if visit(k, v)?.is_break() {
                    return Ok(());
                }
            }
            match next {
                Some(last) => from = Bound::Excluded(last),
                None => return Ok(()),
            }
        }
    }

    /// Up to [`VISIT_PAGE`] of sled's entries under `prefix` from `from` on, with the pending
    /// ops of the same span laid over them; and sled's last key read when there are more.
    fn page(
        &self,
        tree: Tree,
        prefix: &[u8],
        from: &Bound<Vec<u8>>,
    ) -> Result<(Vec<KeyValue>, Option<Vec<u8>>), StoreError> {
        let after_from = |k: &[u8]| match from {
            Bound::Included(f) => k >= f.as_slice(),
            Bound::Excluded(f) => k > f.as_slice(),
            Bound::Unbounded => true,
        };
        'again: for _ in 0..TORN_RETRIES {
            let overlay = lock(&self.pending)?.overlay(tree, prefix);
            let engine = self.engine()?;
            let engine = engine.as_ref().expect("checked by engine()");
            let mut base = Vec::new();
            let mut more = false;
            for kv in engine
                .tree(tree)
                .range::<Vec<u8>, _>((from.clone(), Bound::Unbounded))
            {
                let (k, v) = kv.map_err(self.sled_err())?;
                if !k.starts_with(prefix) {
                    break;
                }
                if base.len() == VISIT_PAGE {
                    more = true;
                    break;
                }
                match engine.resolve(&self.dir, v)? {
                    Ok(v) => base.push((k.to_vec(), v)),
                    Err(_torn) => continue 'again,
                }
            }
            let last = more.then(|| base.last().map(|(k, _)| k.clone())).flatten();
            // The overlay's keys of this page's span; later ones belong to a later page.
            let overlay = overlay
                .into_iter()
                .filter(|(k, _)| after_from(k) && last.as_ref().is_none_or(|l| k <= l))
                .collect();
            return Ok((merge(base, overlay), last));
        }
        Err(kept_changing(&self.dir))
    }

    /// sled's entries under `prefix`, with `overlay` (pending ops read before) laid over them.
    /// Torn: a large value was replaced while it was read; read again.
    fn scan_under(
        &self,
        tree: Tree,
        prefix: &[u8],
        overlay: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    ) -> Result<Result<Vec<KeyValue>, chunks::Torn>, StoreError> {
        let engine = self.engine()?;
        let engine = engine.as_ref().expect("checked by engine()");
        let mut base = Vec::new();
        for kv in engine.tree(tree).scan_prefix(prefix) {
            let (k, v) = kv.map_err(self.sled_err())?;
            match engine.resolve(&self.dir, v)? {
                Ok(v) => base.push((k.to_vec(), v)),
                Err(torn) => return Ok(Err(torn)),
            }
        }
        Ok(Ok(merge(base, overlay)))
    }

    fn scan_keys(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        let overlay = lock(&self.pending)?.overlay(tree, prefix);
        if !overlay.is_empty() {
            let entries = self.scan_prefix(tree, prefix)?;
            return Ok(entries.into_iter().map(|(k, _)| k).collect());
        }
        // Nothing pending here: sled's keys alone, without reading the values.
        let engine = self.engine()?;
        let engine = engine.as_ref().expect("checked by engine()");
        engine
            .tree(tree)
            .scan_prefix(prefix)
            .keys()
            .map(|k| k.map(|k| k.to_vec()).map_err(self.sled_err()))
            .collect()
    }

    fn len(&self, tree: Tree) -> Result<usize, StoreError> {
        let overlay = lock(&self.pending)?.overlay(tree, b"");
        let engine = self.engine()?;
        let engine = engine.as_ref().expect("checked by engine()");
        let sled = engine.tree(tree);
        // Not `sled::Tree::len`: it counts an iterator that, after a failed write, yields the
        // same error forever (see the module doc). The first error ends the count here.
        //
        // The overlay is laid over the keys this iteration saw, not over a second look at
        // sled: the applier may write the overlay's commits into sled between the two, and a
        // count that iterated before and looked after missed them both ways (a ledger of 4
        // counted 0 under a loaded test run).
        let mut overlay: HashMap<Vec<u8>, (bool, bool)> = overlay
            .into_iter()
            .map(|(key, value)| (key, (value.is_some(), false)))
            .collect();
        let mut len = 0;
        for key in sled.iter().keys() {
            let key = key.map_err(self.sled_err())?;
            len += 1;
            if let Some((_, seen)) = overlay.get_mut(key.as_ref()) {
                *seen = true;
            }
        }
        for (present, seen) in overlay.into_values() {
            match (seen, present) {
                (false, true) => len += 1,
                (true, false) => len -= 1,
                _ => {}
            }
        }
        Ok(len)
    }

    fn commit_with(&self, batch: Batch, durability: Durability) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        if self.faulted() {
            return Err(self.unavailable());
        }
        let result = self.commit_inner(batch, durability);
        if let Err(e) = &result {
            self.fail(e, false);
        }
        result
    }

    fn commit_inner(&self, batch: Batch, durability: Durability) -> Result<(), StoreError> {
        let (seq, journaled) = {
            let mut commits = lock(&self.commits)?;
            let seq = commits.seq + 1;
            if commits
                .journal
                .as_ref()
                .is_some_and(|j| j.len() >= JOURNAL_HARD_LIMIT)
            {
                // Backpressure: this commit checkpoints before it appends. Large values
                // (400 kB network configs) filled the journal faster than the applier's
                // checkpoints emptied it, and the 11th such commit in a row was refused
                // although nothing had failed. A checkpoint that fails is a real write
                // failure: the fault and a reopen follow.
                self.checkpoint_locked(&mut commits)?;
            }
            let appended = commits
                .journal
                .as_mut()
                .map(|j| j.append(seq, &batch).map(|()| j.len()));
            let journaled = match appended {
                Some(Ok(len)) => {
                    if lock(&self.pending)?.add(seq, batch) {
                        self.wake.notify_one();
                    }
                    Some(len)
                }
                Some(Err(_)) | None => {
                    // From now on sled's flush makes commits durable (see `Commits`); what
                    // is pending goes into sled first, to keep the order. The applier
                    // then starts a fresh journal (`restart_journal`).
                    if commits.journal.take().is_some() {
                        self.journal_lost.store(true, Ordering::Release);
                        if let Ok(_p) = self.pending.lock() {
                            self.wake.notify_all();
                        }
                    }
                    self.apply_pending()?;
                    let engine = self.engine()?;
                    let engine = engine.as_ref().expect("checked by engine()");
                    transact(&engine.trees, &self.dir, &batch, seq)?;
                    None
                }
            };
            commits.seq = seq;
            (seq, journaled)
        };

        match journaled {
            Some(_) if durability == Durability::SurvivesProcessCrash => {}
            // The fdatasync covers this record and every earlier one.
            Some(_) => self
                .journal_file
                .sync_data()
                .map_err(io_err(&self.journal_path))?,
            None => {
                // Without the journal: flush writes sled's log (sync_file_range), then blobs
                // and the data file are fdatasynced. Blobs first, so a durable log entry never
                // points at a blob that a power cut could lose.
                let engine = self.engine()?;
                let engine = engine.as_ref().expect("checked by engine()");
                self.persist(engine, durability)?;
            }
        }
        // A Process commit is claimed in the kernel only: a power cut may lose it, and a
        // store that lost an unsynced tail after a reboot is not damaged. The next Disk
        // commit's fdatasync covers it.
        self.claim(seq, durability)?;
        if journaled.is_some_and(|len| len >= CHECKPOINT_BYTES) {
            // The applier checkpoints once it has written this commit into sled: off this
            // request's path, which must not pay two fdatasyncs and a 2 MiB write.
            self.journal_full.store(true, Ordering::Release);
        }
        Ok(())
    }

    fn fault(&self) -> Option<String> {
        let f = self.fault.lock().ok()?.clone()?;
        Some(
            StoreError::Unavailable {
                path: self.dir.clone(),
                since: f.since,
                disk_full: f.disk_full,
                cause: f.text(),
            }
            .to_string(),
        )
    }
}

impl Store for SledStore {
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(tree, key)
    }

    fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<KeyValue>, StoreError> {
        self.inner.scan_prefix(tree, prefix)
    }

    fn visit_prefix(
        &self,
        tree: Tree,
        prefix: &[u8],
        visit: &mut Visit<'_>,
    ) -> Result<(), StoreError> {
        self.inner.visit_prefix(tree, prefix, visit)
    }

    fn visit_after(
        &self,
        tree: Tree,
        prefix: &[u8],
        after: Option<&[u8]>,
        visit: &mut VisitUntil<'_>,
    ) -> Result<(), StoreError> {
        self.inner.visit_after(tree, prefix, after, visit)
    }

    /// Applies every op atomically (all or none, across trees) and returns only once durable:
    /// a commit that returned `Ok` survives kill -9 and, with [`Durability::SurvivesPowerCut`] (thanks to
    /// fdatasync), power loss.
    fn commit_with(&self, batch: Batch, durability: Durability) -> Result<(), StoreError> {
        self.inner.commit_with(batch, durability)
    }

    fn scan_keys(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        self.inner.scan_keys(tree, prefix)
    }

    fn len(&self, tree: Tree) -> Result<usize, StoreError> {
        self.inner.len(tree)
    }

    fn fault(&self) -> Option<String> {
        self.inner.fault()
    }
}
