//! Executor::from_env: every variable parsed, bad values are errors naming the variable.
//! One test function, because the environment is process-wide.

mod common;

use std::time::Duration;

use xtc_shards::{Builder, Error};

#[test]
fn env_variables() {
    let clear = || {
        for v in [
            "XTC_SHARDS",
            "XTC_PLACEMENT",
            "XTC_OVERSUBSCRIBE",
            "XTC_PIN",
            "XTC_SERVICE_MODE",
            "XTC_DEADLOCK_GRACE",
            "XTC_RING_CAPACITY",
            "XTC_SPIN_BEFORE_PARK",
            "XTC_REPLY_SPIN",
            "XTC_STEALING",
            "XTC_EAGER_REBALANCE",
            "XTC_STEAL_BACKOFF",
            "XTC_NUMA_SENSITIVITY",
            "XTC_MIN_TASKS_TO_STEAL",
            "XTC_PREEMPT",
            "XTC_STALL_BUDGET",
            "XTC_PREEMPT_SIGNAL",
            "XTC_INTERRUPT_SIGNAL",
        ] {
            std::env::remove_var(v);
        }
    };
    clear();
    std::env::set_var("XTC_SHARDS", "3");
    std::env::set_var("XTC_OVERSUBSCRIBE", "yes");
    std::env::set_var("XTC_PIN", "off");
    std::env::set_var("XTC_SERVICE_MODE", "on");
    std::env::set_var("XTC_DEADLOCK_GRACE", "250ms");
    std::env::set_var("XTC_PLACEMENT", "spread");
    std::env::set_var("XTC_RING_CAPACITY", "64");
    std::env::set_var("XTC_SPIN_BEFORE_PARK", "50us");
    std::env::set_var("XTC_REPLY_SPIN", "0");
    std::env::set_var("XTC_STEALING", "off");
    std::env::set_var("XTC_EAGER_REBALANCE", "on");
    std::env::set_var("XTC_STEAL_BACKOFF", "true");
    std::env::set_var("XTC_NUMA_SENSITIVITY", "2");
    std::env::set_var("XTC_MIN_TASKS_TO_STEAL", "8");
    let ex = Builder::from_env().unwrap().build().unwrap();
    assert_eq!(ex.shard_count(), 3);
    assert_eq!(ex.ring_capacity(), 64);
    assert_eq!(ex.spin_before_park(), Duration::from_micros(50));
    assert_eq!(ex.reply_spin(), Duration::ZERO);
    assert!(!ex.stealing() && ex.eager_rebalance() && ex.steal_backoff());
    assert_eq!(ex.numa_sensitivity(), 2);
    assert_eq!(ex.min_tasks_to_steal(), 8);
    assert!(ex.service_mode());
    assert!(!ex.is_pinned());
    assert_eq!(ex.deadlock_grace(), Some(Duration::from_millis(250)));

    // Units are case-insensitive, as every word a variable takes.
    std::env::set_var("XTC_DEADLOCK_GRACE", "2S");
    std::env::set_var("XTC_SPIN_BEFORE_PARK", "7US");
    let ex = Builder::from_env().unwrap().build().unwrap();
    assert_eq!(ex.deadlock_grace(), Some(Duration::from_secs(2)));
    assert_eq!(ex.spin_before_park(), Duration::from_micros(7));
    // Microseconds also as `µs`, with the micro sign (U+00B5) or the Greek letter mu (U+03BC)
    // most keyboards and editors produce; the Greek one was refused.
    for micro in ["9\u{b5}s", "9\u{3bc}s", "9\u{39c}S"] {
        std::env::set_var("XTC_SPIN_BEFORE_PARK", micro);
        let ex = Builder::from_env().unwrap().build().unwrap();
        assert_eq!(ex.spin_before_park(), Duration::from_micros(9), "{micro}");
    }

    std::env::set_var("XTC_DEADLOCK_GRACE", "off");
    assert_eq!(
        Builder::from_env()
            .unwrap()
            .build()
            .unwrap()
            .deadlock_grace(),
        None
    );

    for (var, bad) in [
        ("XTC_SHARDS", "many"),
        ("XTC_PLACEMENT", "diagonal"),
        ("XTC_SERVICE_MODE", "maybe"),
        ("XTC_OVERSUBSCRIBE", "2"),
        ("XTC_PIN", "loosely"),
        ("XTC_DEADLOCK_GRACE", "5 parsecs"),
        // A duration without its unit (5 ms or 5 s?) is refused; only 0 needs none.
        ("XTC_DEADLOCK_GRACE", "5"),
        ("XTC_PREEMPT", "1"),
        ("XTC_STALL_BUDGET", "100"),
        ("XTC_SPIN_BEFORE_PARK", "20"),
        ("XTC_REPLY_SPIN", "50"),
        // Zero is no "off": it reported every brief all-parked moment as a deadlock.
        ("XTC_DEADLOCK_GRACE", "0"),
        ("XTC_DEADLOCK_GRACE", "0ms"),
        ("XTC_RING_CAPACITY", "0"),
        ("XTC_SPIN_BEFORE_PARK", "soon"),
        // Longer than MAX_SPIN_BEFORE_PARK: run() would wait that long after its last task
        // (a spin of centuries was accepted and kept it from ever returning).
        ("XTC_SPIN_BEFORE_PARK", "2s"),
        ("XTC_REPLY_SPIN", "later"),
        ("XTC_REPLY_SPIN", "2s"),
        ("XTC_STEALING", "sometimes"),
        ("XTC_EAGER_REBALANCE", "eagerly"),
        ("XTC_STEAL_BACKOFF", "2"),
        ("XTC_NUMA_SENSITIVITY", "3"),
        ("XTC_NUMA_SENSITIVITY", "256"),
        ("XTC_MIN_TASKS_TO_STEAL", "-1"),
        ("XTC_MIN_TASKS_TO_STEAL", "99999999999999999999999"),
        ("XTC_SHARDS", "-2"),
        ("XTC_SHARDS", "18446744073709551616"),
        ("XTC_RING_CAPACITY", "1048577"),
        ("XTC_PREEMPT", "often"),
        ("XTC_PREEMPT", "-5ms"),
        ("XTC_STALL_BUDGET", "long"),
        ("XTC_STALL_BUDGET", "-1s"),
        ("XTC_DEADLOCK_GRACE", "-5ms"),
        ("XTC_SPIN_BEFORE_PARK", "99999999999999999999999us"),
        // Set, but only blanks: a bad value like any other, not unset (it read as unset, and
        // the builder's value stood in silently).
        ("XTC_SHARDS", " "),
        ("XTC_PIN", "   "),
        ("XTC_DEADLOCK_GRACE", "  "),
        ("XTC_SPIN_BEFORE_PARK", " "),
        ("XTC_IO", "  "),
        // Not a real-time signal a program may use, or no signal at all.
        ("XTC_PREEMPT_SIGNAL", "SIGUSR1"),
        ("XTC_PREEMPT_SIGNAL", "SIGRTMIN+999"),
        ("XTC_PREEMPT_SIGNAL", "9"),
        ("XTC_PREEMPT_SIGNAL", " "),
        // A blank inside a number: not read as the number without it (35).
        ("XTC_PREEMPT_SIGNAL", "3 5"),
        ("XTC_INTERRUPT_SIGNAL", "SIGRTMIN+x"),
    ] {
        let old = std::env::var(var).ok();
        std::env::set_var(var, bad);
        match Builder::from_env() {
            Err(e @ Error::Env { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(var) && msg.contains(bad), "{msg}");
            }
            other => panic!("{var}={bad}: expected Err(Env), got {other:?}"),
        }
        match old {
            Some(v) => std::env::set_var(var, v),
            None => std::env::remove_var(var),
        }
    }

    // A CPU list too wide to take: the error says what a list may hold (it said only
    // "compact, spread, or cpus:0,2,4", which reads as if this list were fine).
    clear();
    std::env::set_var("XTC_PLACEMENT", "0-70000");
    let msg = Builder::from_env().unwrap_err().to_string();
    assert!(
        msg.contains("XTC_PLACEMENT") && msg.contains("0-3,8") && msg.contains("65536"),
        "{msg}"
    );
    clear();

    // An empty variable is unset, as the crate docs say: the builder's value stays.
    clear();
    std::env::set_var("XTC_SHARDS", "");
    let io = std::env::var_os("XTC_IO");
    std::env::set_var("XTC_IO", "");
    let b = Builder::new().shards(2).oversubscribe(true).env().unwrap();
    match io {
        Some(v) => std::env::set_var("XTC_IO", v),
        None => std::env::remove_var("XTC_IO"),
    }
    assert_eq!(b.build().unwrap().shard_count(), 2);
    clear();

    // A value that is not UTF-8 is an error too, not unset.
    {
        use std::os::unix::ffi::OsStrExt;
        clear();
        let bad = std::ffi::OsStr::from_bytes(b"cpus:0,\xff");
        std::env::set_var("XTC_PLACEMENT", bad);
        match Builder::from_env() {
            Err(e @ Error::Env { .. }) => assert!(e.to_string().contains("XTC_PLACEMENT"), "{e}"),
            other => panic!("XTC_PLACEMENT not UTF-8: expected Err(Env), got {other:?}"),
        }
        clear();
    }

    // `LocalExecutor::new` reads XTC_IO too, and names it when it is bad.
    clear();
    std::env::set_var("XTC_IO", "bogus");
    let r = xtc_shards::LocalExecutor::new();
    std::env::remove_var("XTC_IO");
    match r {
        Err(e @ Error::Env { .. }) => assert!(e.to_string().contains("XTC_IO"), "{e}"),
        other => panic!("LocalExecutor::new with XTC_IO=bogus: expected Err(Env), got {other:?}"),
    }

    // Every duration variable's error lists the units it takes and that the unit is needed
    // (XTC_PREEMPT's and XTC_STALL_BUDGET's said only "such as 0 (off), 1ms, 500us").
    for var in [
        "XTC_PREEMPT",
        "XTC_STALL_BUDGET",
        "XTC_DEADLOCK_GRACE",
        "XTC_SPIN_BEFORE_PARK",
        "XTC_REPLY_SPIN",
    ] {
        clear();
        std::env::set_var(var, "1.5ms");
        let msg = Builder::from_env().unwrap_err().to_string();
        std::env::remove_var(var);
        assert!(
            msg.contains(var) && msg.contains("with its unit, ns, us, ms or s"),
            "{msg}"
        );
    }

    // Too many shards without oversubscription: an Err that says what to do, and names the
    // variables the impossible placement came from (each value was valid alone, so the
    // message named neither).
    clear();
    std::env::set_var("XTC_SHARDS", "4096");
    let e = Builder::from_env().unwrap().build().unwrap_err();
    assert!(matches!(e, Error::EnvPlacement { .. }), "{e:?}");
    assert!(e.to_string().contains("XTC_SHARDS=4096"), "{e}");
    std::env::set_var("XTC_PLACEMENT", "cpus:9999");
    std::env::set_var("XTC_SHARDS", "1");
    let e = Builder::from_env().unwrap().build().unwrap_err();
    assert!(e.to_string().contains("XTC_PLACEMENT=cpus:9999"), "{e}");
    // A setter after `env()` takes its variable's place: the error no longer blames it.
    let refused_with_shards = |n| Builder::from_env().unwrap().shards(n).build().unwrap_err();
    std::env::set_var("XTC_SHARDS", "4096");
    std::env::remove_var("XTC_PLACEMENT");
    let e = refused_with_shards(4097);
    assert!(matches!(e, Error::Numa(_)), "{e:?}");
    assert!(!e.to_string().contains("XTC_SHARDS"), "{e}");
    // Only the variables the refusal depends on: a policy of `compact` or `spread` plays no
    // part in a count refused (the Err said "XTC_PLACEMENT=spread; change or unset them"
    // for a count set in code), and with none left the refusal is a plain `Numa`.
    std::env::remove_var("XTC_SHARDS");
    std::env::set_var("XTC_PLACEMENT", "spread");
    let e = refused_with_shards(4097);
    assert!(matches!(e, Error::Numa(_)), "{e:?}");
    assert!(!e.to_string().contains("XTC_PLACEMENT"), "{e}");
    std::env::set_var("XTC_SHARDS", "4096");
    let e = Builder::from_env().unwrap().build().unwrap_err();
    assert!(matches!(e, Error::EnvPlacement { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("XTC_SHARDS=4096") && !msg.contains("XTC_PLACEMENT"),
        "{msg}"
    );
    // Refusals that need oversubscription on already (too many shards on one CPU of a
    // list, too many per CPU): turning it off only trades them for another, so
    // `XTC_OVERSUBSCRIBE=1` is not blamed.
    std::env::remove_var("XTC_PLACEMENT");
    std::env::remove_var("XTC_SHARDS");
    std::env::set_var("XTC_OVERSUBSCRIBE", "1");
    let cpu = common::affinity()[0];
    let e = Builder::from_env()
        .unwrap()
        .placement(xtc_numa::Policy::Cpus(vec![cpu; 65]))
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::Numa(_)), "{e:?}");
    let e = refused_with_shards(4097 * 64);
    assert!(matches!(e, Error::Numa(_)), "{e:?}");
    std::env::remove_var("XTC_OVERSUBSCRIBE");
    // A CPU list is the count when none is set: named.
    std::env::remove_var("XTC_SHARDS");
    std::env::set_var("XTC_PLACEMENT", "cpus:0,0");
    let e = Builder::from_env().unwrap().build().unwrap_err();
    assert!(e.to_string().contains("XTC_PLACEMENT=cpus:0,0"), "{e}");
    std::env::remove_var("XTC_PLACEMENT");

    // A shard count and a ring capacity each valid alone whose ring mesh is too large (64
    // shards of 2^20-message rings: 32 GiB): the Err names the variables, as a placement
    // error does (it said only "lower ring_capacity or the shard count").
    clear();
    std::env::set_var("XTC_SHARDS", "64");
    std::env::set_var("XTC_OVERSUBSCRIBE", "yes");
    std::env::set_var("XTC_RING_CAPACITY", "1048576");
    let e = Builder::from_env().unwrap().build().unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("XTC_RING_CAPACITY=1048576") && msg.contains("XTC_SHARDS=64"),
        "{msg}"
    );
    // A policy that is not a CPU list sizes nothing: not named.
    std::env::set_var("XTC_PLACEMENT", "compact");
    let msg = Builder::from_env()
        .unwrap()
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("XTC_SHARDS=64") && !msg.contains("XTC_PLACEMENT"),
        "{msg}"
    );
    std::env::remove_var("XTC_PLACEMENT");
    // The setter takes the variable's place; the placement error never names it.
    let e = Builder::from_env()
        .unwrap()
        .ring_capacity(1 << 20)
        .build()
        .unwrap_err();
    assert!(!e.to_string().contains("XTC_RING_CAPACITY"), "{e}");
    std::env::set_var("XTC_OVERSUBSCRIBE", "no");
    std::env::set_var("XTC_SHARDS", "4096");
    let e = Builder::from_env().unwrap().build().unwrap_err();
    assert!(matches!(e, Error::EnvPlacement { .. }), "{e:?}");
    assert!(!e.to_string().contains("XTC_RING_CAPACITY"), "{e}");

    // The signals xtc uses, in the forms a program writes them.
    clear();
    std::env::set_var("XTC_SHARDS", "1");
    std::env::set_var("XTC_PREEMPT_SIGNAL", "SIGRTMIN+4");
    let ex = Builder::from_env().unwrap().build().unwrap();
    assert_eq!(ex.preempt_signal(), libc::SIGRTMIN() + 4);
    std::env::set_var("XTC_PREEMPT_SIGNAL", (libc::SIGRTMAX() - 1).to_string());
    let ex = Builder::from_env().unwrap().build().unwrap();
    assert_eq!(ex.preempt_signal(), libc::SIGRTMAX() - 1);
    // The pool's interrupt signal is one per process, and the executors built above fixed
    // the default: asking for the same is fine, for another an error naming the one in use.
    assert_eq!(ex.interrupt_signal(), libc::SIGRTMIN() + 2);
    std::env::set_var("XTC_INTERRUPT_SIGNAL", "rtmin+2");
    Builder::from_env().unwrap().build().unwrap();
    std::env::set_var("XTC_INTERRUPT_SIGNAL", "SIGRTMIN+5");
    let e = Builder::from_env().unwrap().build().unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("SIGRTMIN+2"), "{e}");
    std::env::remove_var("XTC_INTERRUPT_SIGNAL");
    // The tick and the interrupt cannot share a signal.
    std::env::set_var("XTC_PREEMPT_SIGNAL", "SIGRTMIN+2");
    let e = Builder::from_env().unwrap().build().unwrap_err();
    assert!(e.to_string().contains("interrupt signal"), "{e}");
    // A setter's value outside the real-time range is refused by build().
    let e = Builder::new()
        .shards(1)
        .preempt_signal(libc::SIGUSR1)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("SIGRTMIN"), "{e}");
    clear();
}
