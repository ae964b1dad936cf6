//! Executor::from_env: every variable parsed, bad values are errors naming the variable.
//! One test function, because the environment is process-wide.

use std::time::Duration;

use xtc_shards::{Builder, Error};

#[test]
fn env_variables() {
    let clear = || {
        for v in [
            "XTC_SHARDS",
            "XTC_PLACEMENT",
            "XTC_OVERSUBSCRIBE",
            "XTC_SERVICE_MODE",
            "XTC_DEADLOCK_GRACE",
        ] {
            std::env::remove_var(v);
        }
    };
    clear();
    std::env::set_var("XTC_SHARDS", "3");
    std::env::set_var("XTC_OVERSUBSCRIBE", "yes");
    std::env::set_var("XTC_SERVICE_MODE", "on");
    std::env::set_var("XTC_DEADLOCK_GRACE", "250ms");
    std::env::set_var("XTC_PLACEMENT", "spread");
    let ex = Builder::from_env().unwrap().build().unwrap();
    assert_eq!(ex.shard_count(), 3);
    assert!(ex.service_mode());
    assert_eq!(ex.deadlock_grace(), Some(Duration::from_millis(250)));

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
        ("XTC_DEADLOCK_GRACE", "5 parsecs"),
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

    // Too many shards without oversubscription: an Err that says what to do.
    clear();
    std::env::set_var("XTC_SHARDS", "4096");
    let e = Builder::from_env().unwrap().build().unwrap_err();
    assert!(e.to_string().contains("4096"), "{e}");
    clear();
}
