//! Tests of the QP state-transition table and `check_modify`.

use proptest::prelude::*;
use softrdma_proto::qp::{transition, EINVAL};
use softrdma_proto::{
    check_modify, check_modify_qp, next_state, ModifyQpError, QpAttrMask as M, QpState, QpType,
    TRANSITIONS,
};

use QpState::{
    Err as ERR, Init as INIT, Reset as RESET, Rtr as RTR, Rts as RTS, Sqd as SQD, Sqe as SQE,
};

/// Every named bit, one at a time.
fn named_bits() -> Vec<M> {
    M::all().iter().collect()
}

/// Named bits plus a few bits libibverbs never defined.
fn all_probe_bits() -> Vec<M> {
    let mut v = named_bits();
    for b in [21, 22, 23, 24, 26, 31] {
        v.push(M::from_bits_retain(1 << b));
    }
    v
}

#[test]
fn mask_bit_values_match_verbs_h() {
    let expect: [(M, u32); 22] = [
        (M::STATE, 1 << 0),
        (M::CUR_STATE, 1 << 1),
        (M::EN_SQD_ASYNC_NOTIFY, 1 << 2),
        (M::ACCESS_FLAGS, 1 << 3),
        (M::PKEY_INDEX, 1 << 4),
        (M::PORT, 1 << 5),
        (M::QKEY, 1 << 6),
        (M::AV, 1 << 7),
        (M::PATH_MTU, 1 << 8),
        (M::TIMEOUT, 1 << 9),
        (M::RETRY_CNT, 1 << 10),
        (M::RNR_RETRY, 1 << 11),
        (M::RQ_PSN, 1 << 12),
        (M::MAX_QP_RD_ATOMIC, 1 << 13),
        (M::ALT_PATH, 1 << 14),
        (M::MIN_RNR_TIMER, 1 << 15),
        (M::SQ_PSN, 1 << 16),
        (M::MAX_DEST_RD_ATOMIC, 1 << 17),
        (M::PATH_MIG_STATE, 1 << 18),
        (M::CAP, 1 << 19),
        (M::DEST_QPN, 1 << 20),
        (M::RATE_LIMIT, 1 << 25),
    ];
    for (m, v) in expect {
        assert_eq!(m.bits(), v, "{m}");
    }
    assert_eq!(M::all().bits(), 0x021F_FFFF);
}

#[test]
fn enum_raw_values() {
    let types = [
        (QpType::Rc, 2),
        (QpType::Uc, 3),
        (QpType::Ud, 4),
        (QpType::RawPacket, 8),
        (QpType::XrcSend, 9),
        (QpType::XrcRecv, 10),
    ];
    for (t, v) in types {
        assert_eq!(t.as_raw(), v);
        assert_eq!(QpType::from_raw(v), Some(t));
    }
    for v in [0, 1, 5, 6, 7, 11, 0xff, u32::MAX] {
        assert_eq!(QpType::from_raw(v), None, "{v}");
    }
    for (i, s) in QpState::ALL.iter().enumerate() {
        assert_eq!(s.as_raw(), i as u32);
        assert_eq!(QpState::from_raw(i as u32), Some(*s));
    }
    assert_eq!(QpState::from_raw(7), None);
    assert_eq!(QpState::from_raw(u32::MAX), None);
}

#[test]
fn table_shape() {
    // 22 rows, no duplicates, STATE required exactly when the state changes.
    assert_eq!(TRANSITIONS.len(), 22);
    for (i, a) in TRANSITIONS.iter().enumerate() {
        for b in &TRANSITIONS[i + 1..] {
            assert!(
                !(a.from == b.from && a.to == b.to),
                "duplicate {}->{}",
                a.from,
                a.to
            );
        }
        for ty in QpType::ALL {
            let r = a.rule(ty);
            assert!(r.required.intersection(r.optional).is_empty());
            if a.from == a.to {
                assert!(!r.required.contains(M::STATE));
                assert!(r.optional.contains(M::STATE));
            } else {
                assert!(r.required.contains(M::STATE));
                assert!(!r.optional.contains(M::STATE));
            }
            // CUR_STATE is only ever allowed when leaving RTR, RTS, SQD or SQE.
            if r.optional.contains(M::CUR_STATE) {
                assert!(matches!(a.from, RTR | RTS | SQD | SQE));
            }
            assert!(!r.required.contains(M::CUR_STATE));
            assert!(!(r.required | r.optional).contains(M::CAP));
        }
    }
    // Every state may go to RESET; every state but RESET may go to ERR.
    for s in QpState::ALL {
        assert!(transition(s, RESET).is_some(), "{s}->RESET");
        assert_eq!(transition(s, ERR).is_some(), s != RESET, "{s}->ERR");
    }
}

#[test]
fn every_row_exact_required_passes() {
    for row in TRANSITIONS {
        for ty in QpType::ALL {
            let r = row.rule(ty);
            assert_eq!(
                check_modify(ty, row.from, row.to, r.required),
                Ok(()),
                "{ty} {}->{}",
                row.from,
                row.to
            );
            assert_eq!(
                check_modify(ty, row.from, row.to, r.required | r.optional),
                Ok(()),
                "{ty} {}->{} with all optional",
                row.from,
                row.to
            );
        }
    }
}

#[test]
fn every_row_required_minus_one_bit_fails_naming_it() {
    let mut checked = 0;
    for row in TRANSITIONS {
        for ty in QpType::ALL {
            let r = row.rule(ty);
            for bit in r.required.iter() {
                let mask = r.required - bit;
                let err = check_modify(ty, row.from, row.to, mask).unwrap_err();
                assert_eq!(
                    err,
                    ModifyQpError::InvalidAttrMask {
                        qp_type: ty,
                        from: row.from,
                        to: row.to,
                        missing: bit,
                        not_allowed: M::empty(),
                    }
                );
                let msg = err.to_string();
                assert_eq!(msg, format!("{ty} {}->{}: missing {bit}", row.from, row.to));
                assert_eq!(err.errno(), EINVAL);
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "{checked}");
}

#[test]
fn every_row_required_plus_disallowed_bit_fails_naming_it() {
    for row in TRANSITIONS {
        for ty in QpType::ALL {
            let r = row.rule(ty);
            for bit in all_probe_bits() {
                if (r.required | r.optional).intersects(bit) {
                    continue;
                }
                let err = check_modify(ty, row.from, row.to, r.required | bit).unwrap_err();
                assert_eq!(
                    err,
                    ModifyQpError::InvalidAttrMask {
                        qp_type: ty,
                        from: row.from,
                        to: row.to,
                        missing: M::empty(),
                        not_allowed: bit,
                    },
                    "{ty} {}->{} + {bit}",
                    row.from,
                    row.to
                );
                assert!(err.to_string().ends_with(&format!("not allowed: {bit}")));
            }
        }
    }
}

#[test]
fn every_row_each_optional_bit_passes() {
    for row in TRANSITIONS {
        for ty in QpType::ALL {
            let r = row.rule(ty);
            for bit in r.optional.iter() {
                assert_eq!(check_modify(ty, row.from, row.to, r.required | bit), Ok(()));
            }
        }
    }
}

#[test]
fn invalid_transitions_fail() {
    let mut n = 0;
    for from in QpState::ALL {
        for to in QpState::ALL {
            if transition(from, to).is_some() {
                continue;
            }
            n += 1;
            for ty in QpType::ALL {
                for mask in [M::empty(), M::STATE, M::all(), M::STATE | M::CUR_STATE] {
                    let err = check_modify(ty, from, to, mask).unwrap_err();
                    assert_eq!(
                        err,
                        ModifyQpError::InvalidTransition {
                            qp_type: ty,
                            from,
                            to
                        }
                    );
                    assert_eq!(
                        err.to_string(),
                        format!("{ty} {from}->{to} is not a valid transition")
                    );
                    assert_eq!(err.errno(), EINVAL);
                }
            }
        }
    }
    assert_eq!(n, 49 - 22);
}

#[test]
fn checklist_required_masks() {
    let init_conn = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
    let rtr_uc = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    let rtr_rc = rtr_uc | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    let rts_rc =
        M::STATE | M::SQ_PSN | M::MAX_QP_RD_ATOMIC | M::RETRY_CNT | M::RNR_RETRY | M::TIMEOUT;
    let cases = [
        (
            QpType::Ud,
            RESET,
            INIT,
            M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY,
        ),
        (QpType::Ud, INIT, RTR, M::STATE),
        (QpType::Ud, RTR, RTS, M::STATE | M::SQ_PSN),
        (QpType::Uc, RESET, INIT, init_conn),
        (QpType::Uc, INIT, RTR, rtr_uc),
        (QpType::Uc, RTR, RTS, M::STATE | M::SQ_PSN),
        (QpType::Rc, RESET, INIT, init_conn),
        (QpType::Rc, INIT, RTR, rtr_rc),
        (QpType::Rc, RTR, RTS, rts_rc),
        (QpType::RawPacket, RESET, INIT, M::STATE | M::PORT),
    ];
    for (ty, from, to, req) in cases {
        assert_eq!(
            transition(from, to).unwrap().rule(ty).required,
            req,
            "{ty} {from}->{to}"
        );
    }
}

#[test]
fn example_messages() {
    let mask = M::STATE | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER | M::SQ_PSN;
    let err = check_modify(QpType::Rc, INIT, RTR, mask).unwrap_err();
    assert_eq!(
        err.to_string(),
        "RC INIT->RTR: missing AV|PATH_MTU|DEST_QPN; not allowed: SQ_PSN"
    );
    let err = check_modify(QpType::Ud, RESET, RTS, M::STATE).unwrap_err();
    assert_eq!(err.to_string(), "UD RESET->RTS is not a valid transition");
    let err = check_modify(
        QpType::Ud,
        RTR,
        RTS,
        M::STATE | M::SQ_PSN | M::from_bits_retain(1 << 21),
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "UD RTR->RTS: not allowed: 0x200000");
    let err = check_modify(
        QpType::Ud,
        RTR,
        RTS,
        M::STATE | M::SQ_PSN | M::CAP | M::from_bits_retain(1 << 30),
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "UD RTR->RTS: not allowed: CAP|0x40000000");
    assert_eq!(M::empty().to_string(), "(none)");
}

#[test]
fn no_state_bit_means_stay() {
    // INIT->INIT: tweak the port without STATE.
    assert_eq!(check_modify(QpType::Rc, INIT, INIT, M::PORT), Ok(()));
    assert_eq!(next_state(INIT, M::PORT, RTS), INIT);
    assert_eq!(next_state(INIT, M::PORT | M::STATE, RTS), RTS);
    // Asking for a different state without STATE reports STATE missing.
    let err = check_modify(
        QpType::Rc,
        INIT,
        RTR,
        M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "RC INIT->RTR: missing STATE");
    // RTR->RTR and SQE->SQE are no rows: even an empty mask fails there.
    for ty in QpType::ALL {
        assert!(matches!(
            check_modify(ty, RTR, RTR, M::empty()),
            Err(ModifyQpError::InvalidTransition { .. })
        ));
        assert!(matches!(
            check_modify(ty, SQE, SQE, M::empty()),
            Err(ModifyQpError::InvalidTransition { .. })
        ));
        for s in [RESET, INIT, RTS, SQD, ERR] {
            assert_eq!(check_modify(ty, s, s, M::empty()), Ok(()), "{ty} {s}");
            assert_eq!(check_modify(ty, s, s, M::STATE), Ok(()), "{ty} {s}");
        }
    }
    // RTS->RTS without STATE: RC may change min_rnr_timer, not the timeout.
    assert_eq!(check_modify(QpType::Rc, RTS, RTS, M::MIN_RNR_TIMER), Ok(()));
    assert!(check_modify(QpType::Rc, RTS, RTS, M::TIMEOUT).is_err());
}

#[test]
fn reset_to_err_is_invalid() {
    for ty in QpType::ALL {
        assert_eq!(
            check_modify(ty, RESET, ERR, M::STATE),
            Err(ModifyQpError::InvalidTransition {
                qp_type: ty,
                from: RESET,
                to: ERR
            })
        );
    }
}

#[test]
fn cur_state_handling() {
    let ud_rts = M::STATE | M::SQ_PSN;
    // CUR_STATE matching the real state.
    assert_eq!(
        check_modify_qp(QpType::Ud, RTR, ud_rts | M::CUR_STATE, RTS, RTR),
        Ok(RTS)
    );
    // Not allowed when leaving INIT (the kernel's pre-check), even when it matches.
    let rc_init_rtr = transition(INIT, RTR).unwrap().rc.required;
    let err = check_modify_qp(QpType::Rc, INIT, rc_init_rtr | M::CUR_STATE, RTR, INIT).unwrap_err();
    assert_eq!(err.to_string(), "RC INIT->RTR: not allowed: CUR_STATE");
    // Not allowed on */->ERR rows.
    assert!(check_modify_qp(QpType::Rc, RTS, M::STATE | M::CUR_STATE, ERR, RTS).is_err());
    // The QP went RTS->SQE behind the caller's back: saying RTS is accepted, and SQE->RTS too.
    assert_eq!(
        check_modify_qp(QpType::Ud, SQE, M::STATE | M::CUR_STATE, RTS, RTS),
        Ok(RTS)
    );
    assert_eq!(
        check_modify_qp(QpType::Ud, SQE, M::STATE | M::CUR_STATE, RTS, SQE),
        Ok(RTS)
    );
    assert_eq!(
        check_modify_qp(QpType::Uc, SQE, M::STATE | M::CUR_STATE, RTS, SQD),
        Ok(RTS)
    );
    // Without STATE the state does not change even though CUR_STATE named another one.
    assert_eq!(
        check_modify_qp(QpType::Ud, SQE, M::CUR_STATE | M::QKEY, RTS, RTS),
        Ok(SQE)
    );
    // Contradicting claims fail.
    assert_eq!(
        check_modify_qp(QpType::Rc, RESET, M::STATE | M::CUR_STATE, RTS, RTS),
        Err(ModifyQpError::CurStateMismatch {
            qp_type: QpType::Rc,
            cur_qp_state: RTS,
            actual: RESET
        })
    );
    let err = check_modify_qp(QpType::Ud, RTS, M::STATE | M::CUR_STATE, RTS, SQE).unwrap_err();
    assert_eq!(
        err.to_string(),
        "UD QP: cur_qp_state SQE does not match the QP state RTS"
    );
    assert_eq!(err.errno(), EINVAL);
    // Ordinary path without CUR_STATE: cur_qp_state is ignored.
    assert_eq!(check_modify_qp(QpType::Ud, RTR, ud_rts, RTS, ERR), Ok(RTS));
    assert_eq!(
        check_modify_qp(QpType::Rc, RTS, M::empty(), RESET, ERR),
        Ok(RTS)
    );
}

// ---------------------------------------------------------------------------------------------
// Independent reference: the rules written out again per QP type as nested matches, in the
// kernel's shape (STATE implicit and always allowed, a state change needs STATE).

fn reference_req_opt(ty: QpType, from: QpState, to: QpState) -> Option<(M, M)> {
    use QpType::*;
    let none = M::empty();
    let conn_init = M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
    let conn_alt = M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE;
    let rnr = M::MIN_RNR_TIMER;
    let rc_like = matches!(ty, Rc | XrcRecv); // responder side: has MIN_RNR_TIMER / dest rd atomic
    let send_like = matches!(ty, Rc | XrcSend); // requester side
    Some(match (from, to) {
        (_, RESET) => (none, none),
        (RESET, ERR) => return None,
        (_, ERR) => (none, none),
        (RESET, INIT) => match ty {
            Ud => (M::PKEY_INDEX | M::PORT | M::QKEY, none),
            RawPacket => (M::PORT, none),
            _ => (conn_init, none),
        },
        (INIT, INIT) => match ty {
            Ud => (none, M::PKEY_INDEX | M::PORT | M::QKEY),
            RawPacket => (none, none),
            _ => (none, conn_init),
        },
        (INIT, RTR) => match ty {
            Ud => (none, M::PKEY_INDEX | M::QKEY),
            RawPacket => (none, none),
            _ => {
                let mut req = M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
                if rc_like {
                    req |= M::MAX_DEST_RD_ATOMIC | rnr;
                }
                (req, M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX)
            }
        },
        (RTR, RTS) => {
            let req = match ty {
                Ud | Uc => M::SQ_PSN,
                RawPacket => none,
                XrcRecv => M::TIMEOUT | M::SQ_PSN,
                Rc | XrcSend => {
                    M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC
                }
            };
            let opt = match ty {
                Ud => M::CUR_STATE | M::QKEY,
                RawPacket => M::RATE_LIMIT,
                _ => M::CUR_STATE | conn_alt | if rc_like { rnr } else { none },
            };
            (req, opt)
        }
        (RTS, RTS) => match ty {
            Ud => (none, M::CUR_STATE | M::QKEY),
            RawPacket => (none, M::RATE_LIMIT),
            _ => (
                none,
                M::CUR_STATE | conn_alt | if rc_like { rnr } else { none },
            ),
        },
        (RTS, SQD) => match ty {
            RawPacket => (none, none),
            _ => (none, M::EN_SQD_ASYNC_NOTIFY),
        },
        (SQD, RTS) => match ty {
            Ud => (none, M::CUR_STATE | M::QKEY),
            RawPacket => (none, none),
            _ => (
                none,
                M::CUR_STATE | conn_alt | if rc_like { rnr } else { none },
            ),
        },
        (SQD, SQD) => match ty {
            Ud => (none, M::PKEY_INDEX | M::QKEY),
            RawPacket => (none, none),
            Uc => (none, M::AV | conn_alt | M::PKEY_INDEX),
            _ => {
                let mut opt = M::PORT | M::AV | M::TIMEOUT | conn_alt | M::PKEY_INDEX;
                if send_like {
                    opt |= M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
                }
                if rc_like {
                    opt |= M::MAX_DEST_RD_ATOMIC | rnr;
                }
                (none, opt)
            }
        },
        (SQE, RTS) => match ty {
            Ud => (none, M::CUR_STATE | M::QKEY),
            Uc => (none, M::CUR_STATE | M::ACCESS_FLAGS),
            _ => (none, none),
        },
        _ => return None,
    })
}

fn reference_ok(ty: QpType, from: QpState, to: QpState, mask: M) -> bool {
    if mask.contains(M::CUR_STATE) && !matches!(from, RTR | RTS | SQD | SQE) {
        return false;
    }
    let Some((req, opt)) = reference_req_opt(ty, from, to) else {
        return false;
    };
    if from != to && !mask.contains(M::STATE) {
        return false;
    }
    mask.contains(req) && (mask.bits() & !(req | opt | M::STATE).bits()) == 0
}

fn arb_type() -> impl Strategy<Value = QpType> {
    prop::sample::select(QpType::ALL.to_vec())
}
fn arb_state() -> impl Strategy<Value = QpState> {
    prop::sample::select(QpState::ALL.to_vec())
}
/// Masks biased towards a row's required set so that passing cases are common.
fn arb_mask() -> impl Strategy<Value = M> {
    prop_oneof![
        any::<u32>().prop_map(M::from_bits_retain),
        (0u32..1 << 21).prop_map(M::from_bits_retain),
        (
            0usize..TRANSITIONS.len(),
            0usize..6,
            any::<u32>(),
            any::<u32>()
        )
            .prop_map(|(row, ty, add, drop)| {
                let r = TRANSITIONS[row].rule(QpType::ALL[ty]);
                // Maybe add a few optional bits, maybe drop a required bit.
                let mut m = r.required | (r.optional & M::from_bits_retain(add));
                if drop % 4 == 0 {
                    if let Some(b) = r.required.iter().nth((drop / 4) as usize % 8) {
                        m -= b;
                    }
                }
                m
            }),
    ]
}

#[test]
fn reference_agrees_exhaustively_on_single_bits() {
    for ty in QpType::ALL {
        for from in QpState::ALL {
            for to in QpState::ALL {
                let mut masks = vec![M::empty(), M::STATE];
                if let Some(row) = transition(from, to) {
                    let r = row.rule(ty);
                    masks.push(r.required);
                    masks.push(r.required | r.optional);
                }
                let base = masks.clone();
                for b in base {
                    for bit in all_probe_bits() {
                        masks.push(b ^ bit);
                    }
                }
                for mask in masks {
                    assert_eq!(
                        check_modify(ty, from, to, mask).is_ok(),
                        reference_ok(ty, from, to, mask),
                        "{ty} {from}->{to} {mask}"
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn prop_check_modify_matches_reference(ty in arb_type(), from in arb_state(), to in arb_state(), mask in arb_mask()) {
        let got = check_modify(ty, from, to, mask);
        prop_assert_eq!(got.is_ok(), reference_ok(ty, from, to, mask));
        if let Err(e) = got {
            prop_assert_eq!(e.errno(), EINVAL);
            let msg = e.to_string();
            prop_assert!(msg.starts_with(ty.name()));
            if let ModifyQpError::InvalidAttrMask { missing, not_allowed, .. } = e {
                prop_assert!(!(missing.is_empty() && not_allowed.is_empty()));
                prop_assert!((not_allowed & !mask).is_empty());
                prop_assert!((missing & mask).is_empty());
            }
        }
    }

    #[test]
    fn prop_check_modify_qp_never_panics(ty in arb_type(), actual in arb_state(), mask in arb_mask(), qs in arb_state(), cs in arb_state()) {
        match check_modify_qp(ty, actual, mask, qs, cs) {
            Ok(next) => {
                if mask.contains(M::STATE) {
                    prop_assert_eq!(next, qs);
                } else {
                    prop_assert_eq!(next, actual);
                }
                if !mask.contains(M::CUR_STATE) {
                    prop_assert!(reference_ok(ty, actual, next, mask));
                }
            }
            Err(e) => prop_assert_eq!(e.errno(), EINVAL),
        }
    }
}
