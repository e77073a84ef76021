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
            ("read_write_region:fail@0.05", FaultRule::new(OpKind::ReadWriteRegion, FaultAction::Fail).probability(0.05)),
            ("replace:late-ack=1s id=probe-0001", FaultRule::new(OpKind::Replace, FaultAction::LateAck(ms(1000))).for_id("probe-0001")),
            ("*:fail", FaultRule::new(OpSet::ALL, FaultAction::Fail)),
            ("writes:delay=1s500ms", FaultRule::new(OpSet::WRITES, FaultAction::Delay(ms(1500)))),
            ("reads:replica-lag=2m x1", FaultRule::new(OpSet::READS, FaultAction::ReplicaLag(ms(120_000))).times(1)),
            ("create,replace:fail@1", FaultRule::new(OpSet::WRITES, FaultAction::Fail)),
            ("scan,read_changes:delay=10y", FaultRule::new(OpSet::only(OpKind::Scan).with(OpKind::ReadChanges), FaultAction::Delay(MAX_FAULT_DURATION))),
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
}
