//! `Admin.ListAttachments` (`dipamctl attachments`): the ledger's attachments, as far as the
//! caller may see them, a page at a time.

use dipam_proto::v1::{ListAttachmentsReply, ListAttachmentsRequest};

use crate::{l1_leaves::error::ShimError, l5_node::node::Node};

/// The most records one reply holds, whatever the caller asks: one reply is what a caller
/// makes dipamd hold (read, converted and encoded at once), about 4 KiB a record, so a page
/// is a few MiB at most however large the ledger (docs/performance.md, run 38).
pub const MAX_PAGE: usize = 1_000;

/// The most a request that names no page size (0) is answered with: a client older than
/// paging (dipamctl, or an agent built on an older copy of the API), which reads one reply as
/// the whole ledger. Up to this many it gets them all, as before paging; past it, a refusal
/// (see [`run`]).
pub const DEFAULT_PAGE: usize = 500;

/// The longest page token taken: a key (network, container ID, ifname) is shorter.
const TOKEN: usize = 4 << 10;

/// One page of the ledger's attachments, in key order. Root and --admin-uid see all;
/// another caller only those it created (their netns paths and results are no one else's
/// business). The filters apply while reading, so a page is full of records the caller may
/// see unless it is the last.
pub async fn run(
    node: &Node,
    caller: crate::l1_leaves::access::Caller,
    req: ListAttachmentsRequest,
) -> Result<ListAttachmentsReply, ShimError> {
    use crate::l1_leaves::validate::{bounded, limits};
    bounded(
        "the network filter",
        req.network.as_bytes(),
        limits::NETWORK,
        7,
    )?;
    bounded("the owner filter", req.owner.as_bytes(), limits::NAME, 7)?;
    bounded("the page token", &req.page_token, TOKEN, 7)?;
    let unpaged = req.page_size == 0;
    let size = match req.page_size as usize {
        0 => DEFAULT_PAGE,
        n => n.min(MAX_PAGE),
    };
    let network = (!req.network.is_empty()).then(|| req.network.clone());
    let (owner, after) = (req.owner, req.page_token);
    let (records, next) = node
        .core
        .ledger(move |l| {
            l.page(
                network.as_deref(),
                (!after.is_empty()).then_some(after.as_slice()),
                size,
                |r| (caller.admin || caller.owns(r.creator_uid)) && super::owned_by(r, &owner),
            )
        })
        .await?;
    if unpaged && next.is_some() {
        // A client that knows no pages would take the first page for the whole ledger: an
        // operator would miss attachments, and an agent reconciling its addresses against
        // the list could release one it holds. Refused, so the partial list is never used.
        return Err(ShimError::Invalid {
            msg: format!(
                "more than {DEFAULT_PAGE} attachments match and the request names no page_size"
            ),
            details: "this client predates paged listing: use the dipamctl shipped with this \
                      dipamd (it pages), or set page_size (1-1000) and follow next_page_token \
                      until it is empty. A narrower --network or --owner may fit one reply. \
                      Nothing was listed"
                .into(),
        });
    }
    Ok(ListAttachmentsReply {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        attachments: super::list_from(records, ""),
        next_page_token: next.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use dipam_state::{AttachmentRecord, Owner};

    use super::*;
    use crate::{
        l1_leaves::access::Caller,
        testing::{dense, held},
    };

    /// Every page of a listing as `caller` with `req`'s filters and page size: the container
    /// IDs in order, and the pages' lengths.
    async fn listing(
        node: &Node,
        caller: Caller,
        mut req: ListAttachmentsRequest,
    ) -> (Vec<String>, Vec<usize>) {
        let (mut ids, mut lens) = (Vec::new(), Vec::new());
        loop {
            let reply = run(node, caller, req.clone()).await.unwrap();
            lens.push(reply.attachments.len());
            ids.extend(reply.attachments.into_iter().map(|a| a.container_id));
            if reply.next_page_token.is_empty() {
                return (ids, lens);
            }
            req.page_token = reply.next_page_token;
        }
    }

    /// On real sled with 3,000 pods, one page holds a page, not the ledger: the handler's
    /// peak (reading, converting and answering) is far below what every record takes
    /// decoded, which the reply held before paging at any size of ledger (docs/performance.md,
    /// runs 32 and 38). A size beyond the cap gets the cap; none gets the default, and a
    /// token saying there is more; the pages together list every record once.
    #[test]
    fn a_page_holds_a_page_not_the_ledger() {
        const N: usize = 3_000;
        let _one = held::one_at_a_time();
        let rt = held::runtime();
        let (d, records) = dense::pods(N);
        let mut want: Vec<String> = records.iter().map(|r| r.key.container_id.clone()).collect();
        want.sort();
        drop(records);
        let whole = d.whole(&rt);
        let req = |page_size| ListAttachmentsRequest {
            page_size,
            ..Default::default()
        };
        // The least of three reads of each page: see `held::least`.
        let (reply, peak) = held::least(&rt, 3, || run(&d.node, Caller::ROOT, req(100)));
        let reply = reply.unwrap();
        assert_eq!(reply.attachments.len(), 100);
        eprintln!("ledger decoded: {whole} B; a page of 100: {peak} B at its peak");
        assert!(
            peak * 4 < whole,
            "a page of 100 held {peak} B at its peak; the ledger takes {whole} B decoded"
        );
        // The same page of a ledger a third as large holds as much: the cost is the page's.
        let (small, _) = dense::pods(N / 3);
        let _ = small.whole(&rt);
        let (_, small_peak) = held::least(&rt, 3, || run(&small.node, Caller::ROOT, req(100)));
        eprintln!("a page of 100 of {}: {small_peak} B at its peak", N / 3);
        assert!(
            peak < small_peak + small_peak / 2,
            "a page of 100 held {peak} B at N = {N}, {small_peak} B at N = {}",
            N / 3
        );
        let (first, default_peak) = held::measure(&rt, run(&d.node, Caller::ROOT, req(0)));
        eprintln!("no page size, past {DEFAULT_PAGE}: {default_peak} B at its peak");
        // A client older than paging is refused rather than handed a first page it would
        // take for the ledger; a list that fits one reply is its whole, as before paging.
        match first {
            Err(ShimError::Invalid { msg, details }) => {
                assert!(msg.contains("names no page_size"), "{msg}");
                assert!(details.contains("next_page_token"), "{details}");
            }
            other => panic!("an unpaged request past {DEFAULT_PAGE} got {other:?}"),
        }
        let (few, _) = dense::pods(DEFAULT_PAGE);
        let _ = few.whole(&rt);
        let all = rt.block_on(run(&few.node, Caller::ROOT, req(0))).unwrap();
        assert_eq!(all.attachments.len(), DEFAULT_PAGE);
        assert!(all.next_page_token.is_empty());
        let big = rt
            .block_on(run(&d.node, Caller::ROOT, req(u32::MAX)))
            .unwrap();
        assert_eq!(big.attachments.len(), MAX_PAGE);
        let (ids, lens) = rt.block_on(listing(&d.node, Caller::ROOT, req(u32::MAX)));
        assert_eq!(lens, [1_000, 1_000, 1_000]);
        assert_eq!(ids, want);
    }

    /// The owner and caller filters apply while reading: a non-root caller's pages of the
    /// warm pool's entries are full of its own pool entries, and together are exactly those.
    #[test]
    fn filtered_pages_are_full_of_what_the_caller_may_see() {
        let rt = held::runtime();
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let records: Vec<AttachmentRecord> = (0..600)
            .map(|i| {
                let mut r = dense::record(i, &data);
                if i % 3 == 0 {
                    r.owner = Owner::Pool;
                }
                if i % 2 == 0 {
                    r.creator_uid = Some(1000);
                }
                r
            })
            .collect();
        let mut want: Vec<String> = records
            .iter()
            .filter(|r| r.owner == Owner::Pool && r.creator_uid == Some(1000))
            .map(|r| r.key.container_id.clone())
            .collect();
        want.sort();
        let d = dense::node(&records, dir);
        let user = Caller {
            uid: 1000,
            admin: false,
        };
        let req = ListAttachmentsRequest {
            owner: "pool".into(),
            page_size: 30,
            ..Default::default()
        };
        let (ids, lens) = rt.block_on(listing(&d.node, user, req.clone()));
        assert_eq!(ids, want);
        assert_eq!(lens, [30, 30, 30, 10]);
        let agent = ListAttachmentsRequest {
            owner: "agent".into(),
            ..req.clone()
        };
        assert!(rt.block_on(listing(&d.node, user, agent)).0.is_empty());
        let (all, _) = rt.block_on(listing(&d.node, Caller::ROOT, req));
        assert_eq!(all.len(), 200);
        let long = ListAttachmentsRequest {
            page_token: vec![b'x'; 5 << 10],
            ..Default::default()
        };
        assert!(matches!(
            rt.block_on(run(&d.node, Caller::ROOT, long)),
            Err(ShimError::TooLarge { .. })
        ));
    }
}
