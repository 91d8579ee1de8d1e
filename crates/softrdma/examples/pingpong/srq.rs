//! srq_pingpong's own part: `-q` RC QPs on one CQ whose receives come from one shared
//! receive queue; the exchange carries 256 addresses each way (those past `-q` all zero);
//! the counts of sends and receives are shared by the QPs, and a completion is matched to its
//! QP by its QP number.

use super::{
    check_pages, check_status, client_exchange, mark_pages, move_to_rts, next_completions,
    pick_device, print_summary, server_exchange, Dest, Opts, RECV_WRID, SEND_WRID,
};
use softrdma::{
    AccessFlags, Buffer, Gid, LinkLayer, QpCap, QpInitAttr, QpType, RecvWr, SendFlags, SendWr, Sge,
    SrqAttr, SrqInitAttr, WorkCompletion, WrOpcode,
};
use std::sync::Arc;
use std::time::Instant;

/// The number of addresses each side sends (`MAX_QP` of the C program).
const MAX_QP: usize = 256;

/// Runs srq_pingpong with the parsed options.
pub(super) fn run(o: &Opts) -> Result<(), String> {
    if o.num_qp > o.rx_depth as usize {
        return Err(format!(
            "rx_depth {} is too small for {} QPs -- must have at least one receive per QP.",
            o.rx_depth, o.num_qp
        ));
    }
    if o.num_qp >= MAX_QP {
        return Err(format!(
            "num_qp {} must be less than {}",
            o.num_qp,
            MAX_QP - 1
        ));
    }
    let dev = pick_device(o)?;
    let buf = Arc::new(Buffer::new(o.size)); // zeroed
    let ctx = dev
        .open()
        .map_err(|e| format!("cannot open {}: {e}", dev.name()))?;
    if o.odp {
        return Err(
            "The device isn't ODP capable or does not support RC send, receive and srq with ODP"
                .into(),
        );
    }
    let channel = if o.events {
        Some(
            ctx.create_comp_channel()
                .map_err(|e| format!("cannot create a completion channel: {e}"))?,
        )
    } else {
        None
    };
    let pd = ctx
        .alloc_pd()
        .map_err(|e| format!("cannot allocate a PD: {e}"))?;
    let mr = pd
        .reg_buffer(&buf, AccessFlags::LOCAL_WRITE.bits())
        .map_err(|e| format!("cannot register the buffer: {e}"))?;
    let cq = ctx
        .create_cq(o.rx_depth + o.num_qp as u32, 0, channel.as_ref(), 0)
        .map_err(|e| format!("cannot create a CQ: {e}"))?;
    let srq = pd
        .create_srq(&mut SrqInitAttr {
            srq_context: 0,
            attr: SrqAttr {
                max_wr: o.rx_depth,
                max_sge: 1,
                srq_limit: 0,
            },
        })
        .map_err(|e| format!("Couldn't create SRQ: {e}"))?;
    let mut qps = Vec::with_capacity(o.num_qp);
    let mut send_flags = SendFlags::SIGNALED;
    for i in 0..o.num_qp {
        let mut init = QpInitAttr::new(
            QpType::Rc,
            &cq,
            QpCap {
                max_send_wr: 1,
                max_send_sge: 1,
                ..Default::default()
            },
        );
        init.srq = Some(&srq);
        let qp = pd
            .create_qp(&mut init)
            .map_err(|e| format!("Couldn't create QP[{i}]: {e}"))?;
        if let Ok((_, info)) = qp.query_qp() {
            if info.cap.max_inline_data as usize >= o.size {
                send_flags |= SendFlags::INLINE;
            }
        }
        qps.push(qp);
    }
    for (i, qp) in qps.iter().enumerate() {
        let attr = softrdma::QpAttr {
            qp_state: softrdma::QpState::Init,
            pkey_index: 0,
            port_num: o.ib_port,
            qp_access_flags: 0,
            ..Default::default()
        };
        let mask = softrdma::QpAttrMask::STATE
            | softrdma::QpAttrMask::PKEY_INDEX
            | softrdma::QpAttrMask::PORT
            | softrdma::QpAttrMask::ACCESS_FLAGS;
        qp.modify_qp(&attr, mask.bits())
            .map_err(|e| format!("Failed to modify QP[{i}] to INIT: {e}"))?;
    }
    // The whole buffer: what every receive and every send covers.
    let whole = [Sge {
        addr: buf.addr(),
        length: o.size as u32,
        lkey: mr.lkey(),
    }];
    let post_recv = |n: u32| -> u32 {
        let wr = RecvWr {
            wr_id: RECV_WRID,
            sg_list: &whole,
        };
        (0..n)
            .take_while(|_| srq.post_srq_recv(std::slice::from_ref(&wr)).is_ok())
            .count() as u32
    };
    let mut routs = post_recv(o.rx_depth);
    if routs < o.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    if o.events {
        cq.req_notify_cq(false)
            .map_err(|e| format!("cannot arm the CQ: {e}"))?;
    }
    let port = ctx
        .query_port(o.ib_port)
        .map_err(|e| format!("cannot query port {}: {e}", o.ib_port))?;
    if port.link_layer != LinkLayer::Ethernet && port.lid == 0 {
        return Err("Couldn't get local LID".into());
    }
    let gid = if o.gidx >= 0 {
        ctx.query_gid(o.ib_port, o.gidx as u32)
            .map_err(|_| format!("Could not get local gid for gid index {}", o.gidx))?
    } else {
        Gid::ZERO
    };
    let zero = Dest {
        lid: 0,
        qpn: 0,
        psn: 0,
        gid: Gid::ZERO,
    };
    let mut mine = vec![zero; MAX_QP];
    for (i, qp) in qps.iter().enumerate() {
        let mut psn = [0u8; 4];
        getrandom::fill(&mut psn).map_err(|e| format!("getrandom: {e}"))?;
        mine[i] = Dest {
            lid: u32::from(port.lid),
            qpn: qp.qp_num(),
            psn: u32::from_le_bytes(psn) & 0xff_ffff,
            gid,
        };
        mine[i].print("local address: ", false);
    }
    // Every QP toward its peer; the GRH's destination is the first address's GID, as in the
    // C program.
    let connect_all = |theirs: &[Dest]| -> Result<(), String> {
        for (i, qp) in qps.iter().enumerate() {
            let d = Dest {
                gid: theirs[0].gid,
                ..theirs[i]
            };
            move_to_rts(qp, o, mine[i].psn, &d).map_err(|e| format!("QP[{i}]: {e}"))?;
        }
        Ok(())
    };
    let theirs = match &o.server_name {
        Some(host) => client_exchange(host, o.port, &mine)?,
        None => server_exchange(o.port, &mine, connect_all)?,
    };
    for d in &theirs[..o.num_qp] {
        d.print("remote address:", false);
    }
    if o.server_name.is_some() {
        connect_all(&theirs)?;
    }

    let post_send = |i: usize| -> Result<(), String> {
        let wr = SendWr {
            wr_id: SEND_WRID,
            sg_list: &whole,
            opcode: WrOpcode::Send,
            send_flags,
            ..Default::default()
        };
        qps[i]
            .post_send(&[wr])
            .map_err(|e| format!("Couldn't post send: {}", e.error))
    };
    let mut pending = vec![RECV_WRID; o.num_qp];
    if o.server_name.is_some() {
        if o.chk {
            mark_pages(&buf, 0, o.size);
        }
        for (i, p) in pending.iter_mut().enumerate() {
            post_send(i)?;
            *p = RECV_WRID | SEND_WRID;
        }
    }

    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let mut num_cq_events = 0u32;
    let mut wc = vec![WorkCompletion::default(); o.num_qp + o.rx_depth as usize];
    while rcnt < o.iters || scnt < o.iters {
        let ne = next_completions(channel.as_ref(), &cq, &mut wc, &mut num_cq_events)?;
        for w in &wc[..ne] {
            check_status(w)?;
            let i = qps
                .iter()
                .position(|q| q.qp_num() == w.qp_num)
                .ok_or_else(|| format!("Couldn't find QPN {:06x}", w.qp_num))?;
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs as usize <= o.num_qp {
                        routs += post_recv(o.rx_depth - routs);
                        if routs < o.rx_depth {
                            return Err(format!("Couldn't post receive ({routs})"));
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending[i] &= !w.wr_id;
            if scnt < o.iters && pending[i] == 0 {
                post_send(i)?;
                pending[i] = RECV_WRID | SEND_WRID;
            }
        }
    }
    print_summary(o, start);
    if o.server_name.is_none() && o.chk {
        check_pages(&buf, 0, o.size);
    }
    cq.ack_cq_events(num_cq_events);
    for (i, qp) in qps.into_iter().enumerate() {
        qp.destroy()
            .map_err(|e| format!("Couldn't destroy QP[{i}]: {}", e.error))?;
    }
    srq.destroy()
        .map_err(|e| format!("Couldn't destroy SRQ: {}", e.error))?;
    cq.destroy()
        .map_err(|e| format!("cannot destroy the CQ: {e}"))?;
    mr.dereg()
        .map_err(|e| format!("cannot deregister the MR: {e}"))?;
    pd.dealloc()
        .map_err(|e| format!("cannot deallocate the PD: {e}"))?;
    if let Some(ch) = channel {
        ch.destroy()
            .map_err(|e| format!("cannot destroy the completion channel: {e}"))?;
    }
    ctx.close()
        .map_err(|e| format!("cannot close the device: {e}"))?;
    drop(buf);
    Ok(())
}
