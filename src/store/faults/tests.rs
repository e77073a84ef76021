use super::*;

mod rules {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn parse(spec: &str) -> FaultRule {
        spec.parse().unwrap_or_else(|e| panic!("{spec:?} should parse: {e}"))
    }

    #[test]
    fn the_documented_examples_parse_to_what_they_say() {
        let cases = [
            (
                "replace:late-commit=3s,timeout=2s",
                FaultRule::new(OpKind::Replace, FaultAction::LateCommit { commit_after: ms(3000), timeout: ms(2000) }),
            ),
            ("create:ambiguous@0.1", FaultRule::new(OpKind::Create, FaultAction::Ambiguous).probability(0.1)),
            ("read_replica:replica-lag=5s", FaultRule::new(OpKind::ReadReplica, FaultAction::ReplicaLag(ms(5000)))),
            ("replace:delay=500ms x3", FaultRule::new(OpKind::Replace, FaultAction::Delay(ms(500))).times(3)),
            (
                "read_write_region:fail@0.05",
                FaultRule::new(OpKind::ReadWriteRegion, FaultAction::Fail).probability(0.05),
            ),
            (
                "replace:late-ack=1s id=probe-0001",
                FaultRule::new(OpKind::Replace, FaultAction::LateAck(ms(1000))).for_id("probe-0001"),
            ),
            ("*:fail", FaultRule::new(OpSet::ALL, FaultAction::Fail)),
            ("writes:delay=1s500ms", FaultRule::new(OpSet::WRITES, FaultAction::Delay(ms(1500)))),
            ("reads:replica-lag=2m x1", FaultRule::new(OpSet::READS, FaultAction::ReplicaLag(ms(120_000))).times(1)),
            ("create,replace:fail@1", FaultRule::new(OpSet::WRITES, FaultAction::Fail)),
            (
                "scan,read_changes:delay=10y",
                FaultRule::new(
                    OpSet::only(OpKind::Scan).with(OpKind::ReadChanges),
                    FaultAction::Delay(MAX_FAULT_DURATION),
                ),
            ),
            ("  create:fail   id=a   x2 ", FaultRule::new(OpKind::Create, FaultAction::Fail).times(2).for_id("a")),
        ];
        for (spec, want) in cases {
            assert_eq!(parse(spec), want, "{spec}");
        }
    }

    #[test]
    fn a_rule_displays_as_a_spec_that_parses_back_to_it() {
        for spec in [
            "replace:late-commit=3s,timeout=2s",
            "create:ambiguous@0.1",
            "read_replica:replica-lag=5s",
            "replace:delay=500ms x3",
            "read_write_region:fail@0.05",
            "replace:late-ack=1s id=probe-0001",
            "*:fail",
            "writes:delay=1s500ms",
            "reads:ambiguous x7 id=r1",
            "read_replica,scan:fail",
        ] {
            let rule = parse(spec);
            assert_eq!(rule.to_string(), spec);
            assert_eq!(parse(&rule.to_string()), rule);
        }
    }

    #[test]
    fn a_bad_rule_is_refused_naming_the_bad_part() {
        let cases = [
            ("", "empty"),
            ("   ", "empty"),
            ("replace", "\"replace\" has no ':'"),
            ("raed:fail", "unknown call \"raed\""),
            (":fail", "unknown call \"\""),
            ("create,:fail", "unknown call \"\""),
            ("Create:fail", "unknown call \"Create\""),
            ("create:explode", "unknown action \"explode\""),
            ("create:", "unknown action \"\""),
            ("create:delay", "\"delay\" needs a duration"),
            ("create:delay=", "delay="),
            ("create:delay=3q", "delay=3q"),
            ("create:late-ack=-1s", "late-ack=-1s"),
            ("create:delay=11years", "delay=11years is longer than ten years"),
            ("create:replica-lag=500000years", "replica-lag=500000years"),
            ("create:late-commit=3s", "needs a timeout"),
            ("create:late-commit=3s,deadline=2s", "\"deadline=2s\""),
            ("create:late-commit=3s,timeout=20years", "timeout=20years is longer than ten years"),
            ("create:late-commit=500000years,timeout=1s", "late-commit=500000years"),
            ("create:ambiguous=2s", "\"ambiguous\" takes no value"),
            ("create:fail=yes", "\"fail\" takes no value"),
            ("create:fail@1.5", "\"@1.5\""),
            ("create:fail@-0.1", "\"@-0.1\""),
            ("create:fail@NaN", "\"@NaN\""),
            ("create:fail@0", "\"@0\" is not a number above 0"),
            ("writes:delay=1s@1e-400", "\"@1e-400\" is not a number above 0"),
            ("create:fail@", "\"@\""),
            ("create:fail x0", "\"x0\""),
            ("create:fail xthree", "\"xthree\""),
            ("create:fail x2 x3", "\"x3\": count given twice"),
            ("create:fail@0.5 x3", "both \"@0.5\" and \"x3\""),
            ("create:fail id=", "\"id=\""),
            ("create:fail id=a id=b", "\"id=b\": id given twice"),
            ("create:fail now", "unknown option \"now\""),
            ("create:replica-lag=5s", "replica-lag acts on read_replica only, and \"create\""),
            ("writes:replica-lag=5s", "\"writes\" does not include it"),
            ("scan:fail id=r1", "id= never matches \"scan\""),
        ];
        for (spec, part) in cases {
            let err = spec.parse::<FaultRule>().expect_err(spec);
            assert_eq!(err.spec, spec);
            let message = err.to_string();
            assert!(message.contains(part), "{spec:?}: {message:?} should name {part:?}");
        }
    }

    #[test]
    fn op_sets_hold_what_their_names_say() {
        assert_eq!(OpSet::ALL.iter().collect::<Vec<_>>(), OpKind::ALL);
        assert_eq!(OpSet::WRITES.iter().collect::<Vec<_>>(), [OpKind::Create, OpKind::Replace]);
        assert!(OpKind::ALL.iter().all(|k| OpSet::WRITES.contains(*k) == k.is_write()));
        assert_eq!(OpSet::READS.iter().collect::<Vec<_>>(), [OpKind::ReadWriteRegion, OpKind::ReadReplica]);
        assert_eq!(OpSet::EMPTY.iter().count(), 0);
        assert_eq!(format!("{:?}", OpSet::only(OpKind::Scan).with(OpKind::Create)), "OpSet(create,scan)");
    }

    #[test]
    fn a_rule_matches_its_calls_its_id_and_replica_lag_only_replica_reads() {
        let rule = FaultRule::new(OpSet::ALL, FaultAction::Fail).for_id("r1");
        assert!(rule.matches(OpKind::Create, Some("r1")));
        assert!(!rule.matches(OpKind::Create, Some("r2")));
        assert!(!rule.matches(OpKind::Scan, None), "a call without an id never matches an id filter");
        let lag = FaultRule::new(OpSet::ALL, FaultAction::ReplicaLag(ms(1)));
        let hit: Vec<_> = OpKind::ALL.into_iter().filter(|k| lag.matches(*k, Some("r1"))).collect();
        assert_eq!(hit, [OpKind::ReadReplica]);
    }

    #[tokio::test]
    async fn a_step_rule_matches_only_calls_inside_that_step() {
        let rule = parse("replace:delay=2s step=renew");
        assert_eq!(rule, FaultRule::new(OpKind::Replace, FaultAction::Delay(ms(2000))).in_step("renew"));
        assert_eq!(rule.to_string(), "replace:delay=2s step=renew", "displays as it parses");
        assert!(!rule.matches(OpKind::Replace, Some("r1")), "outside any step");
        assert!(!in_step("preLock", async { rule.matches(OpKind::Replace, Some("r1")) }).await);
        assert!(in_step("renew", async { rule.matches(OpKind::Replace, Some("r1")) }).await);
        assert!(!in_step("renew", async { rule.matches(OpKind::Create, Some("r1")) }).await, "nor other calls");
    }

    #[test]
    fn a_step_must_be_a_lock_step_named_once() {
        for (spec, says) in [
            ("replace:fail step=renewal", "unknown step"),
            ("replace:fail step=", "unknown step"),
            ("replace:fail step=renew step=swap", "step given twice"),
        ] {
            let e = spec.parse::<FaultRule>().expect_err(spec).to_string();
            assert!(e.contains(says), "{spec}: {e}");
        }
    }
}

/// The wrapper over a memory store, all on tokio's paused clock.
mod wrapper {
    use std::sync::Arc;

    use tokio::time::{sleep, Instant};

    use super::*;
    use crate::clock::TokioClock;
    use crate::store::counting::CountingStore;
    use crate::store::memory::{MemoryStore, MemoryStoreConfig};

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn doc(id: &str) -> LocationDocument {
        LocationDocument::new(id, "westeurope")
    }

    fn moved(id: &str) -> LocationDocument {
        LocationDocument::new(id, "northeurope")
    }

    struct Setup {
        clock: Arc<TokioClock>,
        memory: Arc<MemoryStore>,
        /// The calls that reached the memory store (were forwarded).
        reached: Arc<CountingStore>,
        store: Arc<FaultyStore>,
    }

    fn setup_lagging(seed: u64, replica_lag: Duration, rules: &[&str]) -> Setup {
        let clock = Arc::new(TokioClock::at_epoch());
        let config = MemoryStoreConfig { replica_lag, ..MemoryStoreConfig::default() };
        let memory = Arc::new(MemoryStore::new(clock.clone(), config));
        let reached = Arc::new(CountingStore::new(memory.clone()));
        let mut store = FaultyStore::new(reached.clone(), clock.clone(), seed);
        for spec in rules {
            store = store.with_rule(spec.parse().unwrap());
        }
        Setup { clock, memory, reached, store: Arc::new(store) }
    }

    fn setup(rules: &[&str]) -> Setup {
        setup_lagging(1, Duration::ZERO, rules)
    }

    /// The write region's copy, straight from the memory store (no fault, not counted).
    async fn stored(memory: &MemoryStore, id: &str) -> Option<Versioned> {
        match memory.read(id, ReadFrom::WriteRegion).await {
            Ok(v) => Some(v),
            Err(StoreError::NotFound) => None,
            Err(e) => panic!("memory store failed: {e}"),
        }
    }

    fn spawn_create(store: &Arc<FaultyStore>, id: &str) -> tokio::task::JoinHandle<Result<Committed, StoreError>> {
        let (store, doc) = (store.clone(), doc(id));
        tokio::spawn(async move { store.create(&doc).await })
    }

    #[tokio::test(start_paused = true)]
    async fn late_commit_times_out_first_then_lands() {
        let Setup { clock, memory, store, .. } = setup(&["create:late-commit=3s,timeout=2s"]);
        let (t0, start) = (clock.now(), Instant::now());

        let answer = store.create(&doc("r1")).await;
        assert!(matches!(answer, Err(StoreError::OutcomeUnknown(_))), "{answer:?}");
        assert_eq!(start.elapsed(), secs(2), "the caller hears at its timeout");
        assert_eq!(stored(&memory, "r1").await, None, "not committed before commit_after");
        sleep(ms(999)).await;
        assert_eq!(stored(&memory, "r1").await, None);

        store.settle().await;
        assert_eq!(start.elapsed(), secs(3));
        let landed = stored(&memory, "r1").await.expect("the write lands after its caller gave up");
        assert_eq!(landed.committed_at - t0, chrono::TimeDelta::seconds(3));
        assert_eq!(store.stats().injected(OpKind::Create, FaultKind::LateCommit), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn late_commit_lands_even_when_the_caller_is_cancelled() {
        let Setup { memory, store, .. } = setup(&["create:late-commit=3s,timeout=2s"]);
        let call = spawn_create(&store, "r1");
        sleep(secs(1)).await;
        call.abort();
        sleep(secs(3)).await;
        assert!(stored(&memory, "r1").await.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn late_commit_within_the_timeout_answers_at_the_commit() {
        let Setup { clock, memory, store, .. } = setup(&["create:late-commit=3s,timeout=5s"]);
        let (t0, start) = (clock.now(), Instant::now());
        let committed = store.create(&doc("r1")).await.unwrap();
        assert_eq!(start.elapsed(), secs(3));
        assert_eq!(committed.committed_at - t0, chrono::TimeDelta::seconds(3));
        assert_eq!(stored(&memory, "r1").await.unwrap().etag, committed.etag);
    }

    #[tokio::test(start_paused = true)]
    async fn late_commit_on_a_read_is_a_timeout_that_reads_nothing() {
        let Setup { memory, reached, store, .. } = setup(&["read_write_region:late-commit=3s,timeout=2s x1"]);
        memory.create(&doc("r1")).await.unwrap();
        let start = Instant::now();
        let answer = store.read("r1", ReadFrom::WriteRegion).await;
        assert!(matches!(answer, Err(StoreError::Unavailable(_))), "{answer:?}");
        assert_eq!(start.elapsed(), secs(2));
        assert_eq!(reached.calls().read_write_region, 0, "never forwarded");

        store.add_rule("read_write_region:late-commit=1s,timeout=2s".parse().unwrap());
        assert!(store.read("r1", ReadFrom::WriteRegion).await.is_ok());
        assert_eq!(start.elapsed(), secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn ambiguous_write_is_applied_but_reported_unknown() {
        let Setup { memory, reached, store, .. } = setup(&["writes:ambiguous", "reads:ambiguous"]);
        let answer = store.create(&doc("r1")).await;
        assert!(matches!(answer, Err(StoreError::OutcomeUnknown(_))), "{answer:?}");
        let first = stored(&memory, "r1").await.expect("applied");

        let answer = store.replace(&moved("r1"), &first.etag).await;
        assert!(matches!(answer, Err(StoreError::OutcomeUnknown(_))), "{answer:?}");
        assert_eq!(stored(&memory, "r1").await.unwrap().doc.primary.location, "northeurope");

        let answer = store.read("r1", ReadFrom::WriteRegion).await;
        assert!(matches!(answer, Err(StoreError::Unavailable(_))), "a read has no unknown outcome: {answer:?}");
        assert_eq!(reached.calls().read_write_region, 1, "forwarded, then failed");
    }

    #[tokio::test(start_paused = true)]
    async fn fail_applies_nothing() {
        let Setup { memory, reached, store, .. } = setup(&["replace:fail", "create:fail x1"]);
        let answer = store.create(&doc("r1")).await;
        assert!(matches!(answer, Err(StoreError::Unavailable(_))), "{answer:?}");
        assert_eq!(reached.calls().create, 0, "never forwarded");
        assert_eq!(stored(&memory, "r1").await, None);

        let first = store.create(&doc("r1")).await.unwrap();
        assert!(matches!(store.replace(&moved("r1"), &first.etag).await, Err(StoreError::Unavailable(_))));
        assert_eq!(stored(&memory, "r1").await.unwrap().etag, first.etag, "unchanged");
        assert_eq!(reached.calls().replace, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn late_ack_applies_before_answering() {
        let Setup { clock, memory, store, .. } = setup(&["create:late-ack=1s"]);
        let (t0, start) = (clock.now(), Instant::now());
        let call = spawn_create(&store, "r1");
        sleep(ms(500)).await;
        assert!(!call.is_finished(), "not answered yet");
        let landed = stored(&memory, "r1").await.expect("already applied");
        assert_eq!(landed.committed_at, t0);
        let committed = call.await.unwrap().unwrap();
        assert_eq!(start.elapsed(), secs(1));
        assert_eq!(committed.etag, landed.etag);
    }

    #[tokio::test(start_paused = true)]
    async fn delay_commits_late_and_answers_at_the_commit() {
        let Setup { clock, memory, store, .. } = setup(&["create:delay=1s"]);
        let (t0, start) = (clock.now(), Instant::now());
        let call = spawn_create(&store, "r1");
        sleep(ms(500)).await;
        assert_eq!(stored(&memory, "r1").await, None, "not forwarded yet");
        let committed = call.await.unwrap().unwrap();
        assert_eq!(start.elapsed(), secs(1));
        assert_eq!(committed.committed_at - t0, chrono::TimeDelta::seconds(1));
        assert_eq!(stored(&memory, "r1").await.unwrap().etag, committed.etag);
    }

    #[tokio::test(start_paused = true)]
    async fn replica_lag_answers_the_older_version_and_not_found_for_a_new_document() {
        let Setup { memory, store, .. } = setup(&[]);
        let v1 = store.create(&doc("r1")).await.unwrap();
        sleep(secs(3)).await;
        let v2 = store.replace(&moved("r1"), &v1.etag).await.unwrap();
        sleep(secs(1)).await;
        store.create(&doc("r2")).await.unwrap();
        store.add_rule("read_replica:replica-lag=2s".parse().unwrap());

        // Now = t0 + 4 s; 2 s back, only v1 (t0) and nothing of r2 (t0 + 4 s) existed.
        assert_eq!(store.read("r1", ReadFrom::Replica).await.unwrap().etag, v1.etag);
        assert_eq!(store.read("r2", ReadFrom::Replica).await, Err(StoreError::NotFound));
        assert_eq!(memory.read("r1", ReadFrom::Replica).await.unwrap().etag, v2.etag, "the inner replica has v2");
        assert_eq!(store.read("r1", ReadFrom::WriteRegion).await.unwrap().etag, v2.etag, "write region untouched");
        sleep(secs(1)).await;
        assert_eq!(store.read("r1", ReadFrom::Replica).await.unwrap().etag, v2.etag);
        assert_eq!(store.read("r2", ReadFrom::Replica).await, Err(StoreError::NotFound));
        sleep(secs(1)).await;
        assert!(store.read("r2", ReadFrom::Replica).await.is_ok());
        assert_eq!(store.stats().injected(OpKind::ReadReplica, FaultKind::ReplicaLag), 5);
        assert_eq!(store.stats().injected(OpKind::ReadWriteRegion, FaultKind::ReplicaLag), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn replica_lag_adds_to_the_inner_replicas_lag() {
        // The inner replica lags 1 s; writes at t0, t0 + 2 s and t0 + 3.5 s; read at t0 + 4.4 s.
        let Setup { memory, store, .. } = setup_lagging(1, secs(1), &[]);
        let v1 = store.create(&doc("r1")).await.unwrap();
        sleep(secs(2)).await;
        let v2 = store.replace(&moved("r1"), &v1.etag).await.unwrap();
        sleep(ms(1500)).await;
        store.replace(&doc("r1"), &v2.etag).await.unwrap();
        sleep(ms(900)).await;
        assert_eq!(memory.read("r1", ReadFrom::Replica).await.unwrap().etag, v2.etag);

        // The inner replica shows v2, so its view is before t0 + 3.5 s; 2 s before that
        // only v1 existed (a lag counted from now would show v2, committed at t0 + 2 s).
        store.add_rule("read_replica:replica-lag=2s".parse().unwrap());
        assert_eq!(store.read("r1", ReadFrom::Replica).await.unwrap().etag, v1.etag);
    }

    #[tokio::test(start_paused = true)]
    async fn replica_lag_knows_versions_seen_by_reads_and_scans() {
        let Setup { memory, store, .. } = setup(&[]);
        // Written around the wrapper, then seen through it.
        let v1 = memory.create(&doc("r1")).await.unwrap();
        store.scan(None, 10).await.unwrap();
        sleep(secs(3)).await;
        memory.replace(&moved("r1"), &v1.etag).await.unwrap();
        store.add_rule("read_replica:replica-lag=2s".parse().unwrap());
        assert_eq!(store.read("r1", ReadFrom::Replica).await.unwrap().etag, v1.etag);

        // Never seen through the wrapper: it knows no older version than the one shown.
        memory.create(&doc("r2")).await.unwrap();
        sleep(secs(3)).await;
        let r2 = memory.read("r2", ReadFrom::WriteRegion).await.unwrap();
        memory.replace(&moved("r2"), &r2.etag).await.unwrap();
        assert_eq!(store.read("r2", ReadFrom::Replica).await, Err(StoreError::NotFound));
    }

    /// Which of 200 creates failed how, under two probability rules.
    async fn outcomes(seed: u64) -> Vec<&'static str> {
        let Setup { store, .. } = setup_lagging(seed, Duration::ZERO, &["create:fail@0.2", "create:ambiguous@0.25"]);
        let mut seen = Vec::new();
        for i in 0..200 {
            seen.push(match store.create(&doc(&format!("r{i}"))).await {
                Ok(_) => "ok",
                Err(StoreError::Unavailable(_)) => "fail",
                Err(StoreError::OutcomeUnknown(_)) => "ambiguous",
                Err(e) => panic!("{e}"),
            });
        }
        let stats = store.stats();
        let count = |what| seen.iter().filter(|s| **s == what).count() as u64;
        assert_eq!(stats.injected(OpKind::Create, FaultKind::Fail), count("fail"));
        assert_eq!(stats.injected(OpKind::Create, FaultKind::Ambiguous), count("ambiguous"));
        seen
    }

    #[tokio::test(start_paused = true)]
    async fn probability_rules_repeat_for_a_seed_and_differ_across_seeds() {
        let first = outcomes(7).await;
        assert_eq!(outcomes(7).await, first, "same seed, same call order, same faults");
        assert_ne!(outcomes(8).await, first);
        let fails = first.iter().filter(|s| **s == "fail").count();
        let ambiguous = first.iter().filter(|s| **s == "ambiguous").count();
        // Expected 40 and 40 (0.25 of the 160 calls the first rule let through).
        assert!((20..=60).contains(&fails), "{fails} of 200 at p = 0.2");
        assert!((20..=60).contains(&ambiguous), "{ambiguous} of 200");
    }

    #[tokio::test(start_paused = true)]
    async fn a_count_rule_hits_the_next_n_calls_then_goes() {
        let Setup { store, .. } = setup(&["create:fail x2"]);
        assert!(store.create(&doc("r1")).await.is_err());
        assert_eq!(store.rules(), vec![FaultRule::new(OpKind::Create, FaultAction::Fail).times(1)]);
        assert!(store.create(&doc("r1")).await.is_err());
        assert!(store.rules().is_empty());
        assert!(store.create(&doc("r1")).await.is_ok());
        assert_eq!(store.stats().injected(OpKind::Create, FaultKind::Fail), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_id_filter_hits_only_that_document() {
        let Setup { store, .. } = setup(&["*:fail id=probe-0001"]);
        store.create(&doc("probe-0002")).await.unwrap();
        assert!(store.create(&doc("probe-0001")).await.is_err());
        assert!(store.read("probe-0001", ReadFrom::Replica).await.is_err());
        store.read("probe-0002", ReadFrom::Replica).await.unwrap();
        store.scan(None, 10).await.unwrap();
        store.read_changes(&ChangeCursor::beginning(), 10).await.unwrap();
        assert_eq!(store.stats().injected_total(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn rules_switch_on_and_off_in_use_and_everything_is_counted() {
        let Setup { store, .. } = setup(&[]);
        let first = store.create(&doc("r1")).await.unwrap();
        store.add_rule("replace:fail".parse().unwrap());
        assert!(store.replace(&moved("r1"), &first.etag).await.is_err());
        store.clear_rules();
        store.replace(&moved("r1"), &first.etag).await.unwrap();
        store.add_rule("reads:delay=1s x1".parse().unwrap());
        store.read("r1", ReadFrom::WriteRegion).await.unwrap();
        store.read("r1", ReadFrom::Replica).await.unwrap();
        store.read_changes(&ChangeCursor::beginning(), 10).await.unwrap();
        store.scan(None, 10).await.unwrap();

        let stats = store.stats();
        let injected: Vec<_> = stats.injected_cells().filter(|c| c.2 > 0).collect();
        assert_eq!(injected, [(OpKind::ReadWriteRegion, FaultKind::Delay, 1), (OpKind::Replace, FaultKind::Fail, 1)]);
        assert_eq!(stats.injected_cells().count(), OpKind::ALL.len() * FaultKind::ALL.len(), "no cell left out");
        assert_eq!(stats.injected_total(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_poisoned_lock_does_not_stop_the_store() {
        let Setup { store, .. } = setup(&["create:fail x1"]);
        let holder = store.clone();
        let panicked = std::thread::spawn(move || {
            let _rules = holder.rules.lock().unwrap();
            let _seen = holder.seen.lock().unwrap();
            panic!("poisoning the wrapper's locks on purpose");
        })
        .join();
        assert!(panicked.is_err() && store.rules.is_poisoned() && store.seen.is_poisoned());
        assert!(store.create(&doc("r1")).await.is_err());
        store.create(&doc("r1")).await.unwrap();
        store.add_rule("*:fail".parse().unwrap());
        assert_eq!(
            store.stats().injected(OpKind::Create, FaultKind::Fail),
            1,
            "the first create failed, the second did not"
        );
        assert_eq!(store.rules().len(), 1);
        assert!(format!("{store:?}").contains("seed: 1"));
    }
}
