//! The `#[repr(C)]` structs of `softrdma_capi::abi` against the installed rdma-core headers:
//! a C program prints `sizeof`, `_Alignof` and `offsetof` of every struct and field listed
//! in [`LAYOUTS`]; the Rust side computes the same with `size_of`/`offset_of!`.
//!
//! To check another struct, add one line to the list: `struct NAME { field, a.b, c => rust_c }`
//! (`=>` names the Rust field path when it differs from the C one, e.g. an anonymous C union).

mod common;

use softrdma_capi::abi::*;
use std::collections::BTreeMap;

/// Headers the generated C program includes.
const HEADERS: &[&str] = &["infiniband/verbs.h", "rdma/rdma_cma.h"];

struct Layout {
    c_type: &'static str,
    name: &'static str,
    size: usize,
    align: usize,
    fields: Vec<(&'static str, usize)>,
}

macro_rules! rust_offset {
    ($t:ident; $($c:ident).+ ;) => { std::mem::offset_of!($t, $($c).+) };
    ($t:ident; $($c:ident).+ ; $($r:ident).+) => { std::mem::offset_of!($t, $($r).+) };
}

macro_rules! layouts {
    ($( $kw:ident $name:ident { $( $($cf:ident).+ $(=> $($rf:ident).+)? ),* $(,)? } )*) => {
        vec![ $( Layout {
            c_type: concat!(stringify!($kw), " ", stringify!($name)),
            name: stringify!($name),
            size: std::mem::size_of::<$name>(),
            align: std::mem::align_of::<$name>(),
            fields: vec![ $( (
                stringify!($($cf).+),
                rust_offset!($name; $($cf).+ ; $($($rf).+)?),
            ) ),* ],
        } ),* ]
    };
}

// THE LIST: one line per struct (C keyword, name, fields).
#[rustfmt::skip]
fn layouts() -> Vec<Layout> {
    layouts! {
        union ibv_gid { raw, global.subnet_prefix, global.interface_id }
        struct ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }
        struct ibv_device { _ops, node_type, transport_type, name, dev_name, dev_path, ibdev_path }
        struct ibv_context_ops { _compat_query_device, _compat_query_port, _compat_alloc_pd, _compat_dealloc_pd, _compat_reg_mr, _compat_rereg_mr, _compat_dereg_mr, alloc_mw, bind_mw, dealloc_mw, _compat_create_cq, poll_cq, req_notify_cq, _compat_cq_event, _compat_resize_cq, _compat_destroy_cq, _compat_create_srq, _compat_modify_srq, _compat_query_srq, _compat_destroy_srq, post_srq_recv, _compat_create_qp, _compat_query_qp, _compat_modify_qp, _compat_destroy_qp, post_send, post_recv, _compat_create_ah, _compat_destroy_ah, _compat_attach_mcast, _compat_detach_mcast, _compat_async_event }
        struct ibv_context { device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat }
        struct verbs_context { query_port, advise_mr, alloc_null_mr, read_counters, attach_counters_point_flow, create_counters, destroy_counters, reg_dm_mr, alloc_dm, free_dm, modify_flow_action_esp, destroy_flow_action, create_flow_action_esp, modify_qp_rate_limit, alloc_parent_domain, dealloc_td, alloc_td, modify_cq, post_srq_ops, destroy_rwq_ind_table, create_rwq_ind_table, destroy_wq, modify_wq, create_wq, query_rt_values, create_cq_ex, priv => priv_, query_device_ex, ibv_destroy_flow, ABI_placeholder2, ibv_create_flow, ABI_placeholder1, open_qp, create_qp_ex, get_srq_num, create_srq_ex, open_xrcd, close_xrcd, _ABI_placeholder3, sz, context }
        struct ibv_pd { context, handle }
        struct ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        struct ibv_mw { context, pd, rkey, handle, type => type_ }
        struct ibv_comp_channel { context, fd, refcnt }
        struct ibv_cq { context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed, async_events_completed }
        struct ibv_qp { context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type, mutex, cond, events_completed }
        struct ibv_srq { context, srq_context, pd, handle, mutex, cond, events_completed }
        struct ibv_ah { context, pd, handle }
        struct ibv_wc { wr_id, status, opcode, vendor_err, byte_len, imm_data, invalidated_rkey => imm_data, qp_num, src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits }
        struct ibv_sge { addr, length, lkey }
        struct ibv_send_wr { wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, invalidate_rkey => imm_data, wr.rdma.remote_addr, wr.rdma.rkey, wr.atomic.remote_addr, wr.atomic.compare_add, wr.atomic.swap, wr.atomic.rkey, wr.ud.ah, wr.ud.remote_qpn, wr.ud.remote_qkey, qp_type.xrc.remote_srqn, bind_mw.mw => ext.bind_mw.mw, bind_mw.rkey => ext.bind_mw.rkey, bind_mw.bind_info.mr => ext.bind_mw.bind_info.mr, bind_mw.bind_info.addr => ext.bind_mw.bind_info.addr, bind_mw.bind_info.length => ext.bind_mw.bind_info.length, bind_mw.bind_info.mw_access_flags => ext.bind_mw.bind_info.mw_access_flags, tso.hdr => ext.tso.hdr, tso.hdr_sz => ext.tso.hdr_sz, tso.mss => ext.tso.mss }
        struct ibv_recv_wr { wr_id, next, sg_list, num_sge }
        struct ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data }
        struct ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
        struct ibv_qp_attr { qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num, qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index, en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, rate_limit }
        struct ibv_ah_attr { grh, dlid, sl, src_path_bits, static_rate, is_global, port_num }
        struct ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
        struct ibv_device_attr { fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id, vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd, max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom, max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw, max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach, max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr, max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt }
        struct ibv_port_attr { state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr, qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout, init_type_reply, active_width, active_speed, phys_state, link_layer, flags, port_cap_flags2 }
        struct ibv_async_event { element.cq, element.qp, element.srq, element.wq, element.port_num, event_type }
        struct ibv_srq_init_attr { srq_context, attr }
        struct ibv_srq_attr { max_wr, max_sge, srq_limit }
        struct ibv_query_device_ex_input { comp_mask }
        struct ibv_odp_caps { general_caps, per_transport_caps.rc_odp_caps, per_transport_caps.uc_odp_caps, per_transport_caps.ud_odp_caps }
        struct ibv_tso_caps { max_tso, supported_qpts }
        struct ibv_rss_caps { supported_qpts, max_rwq_indirection_tables, max_rwq_indirection_table_size, rx_hash_fields_mask, rx_hash_function }
        struct ibv_packet_pacing_caps { qp_rate_limit_min, qp_rate_limit_max, supported_qpts }
        struct ibv_tm_caps { max_rndv_hdr_size, max_num_tags, flags, max_ops, max_sge }
        struct ibv_cq_moderation_caps { max_cq_count, max_cq_period }
        struct ibv_pci_atomic_caps { fetch_add, swap, compare_swap }
        struct ibv_device_attr_ex { orig_attr, comp_mask, odp_caps, completion_timestamp_mask, hca_core_clock, device_cap_flags_ex, tso_caps, rss_caps, max_wq_type_rq, packet_pacing_caps, raw_packet_caps, tm_caps, cq_mod_caps, max_dm_size, pci_atomic_caps, xrc_odp_caps, phys_port_cnt_ex }
        struct ibv_mw_bind_info { mr, addr, length, mw_access_flags }
        struct ibv_mw_bind { wr_id, send_flags, bind_info }
        struct ibv_cq_ex { context => cq.context, channel => cq.channel, cq_context => cq.cq_context, handle => cq.handle, cqe => cq.cqe, mutex => cq.mutex, cond => cq.cond, comp_events_completed => cq.comp_events_completed, async_events_completed => cq.async_events_completed, comp_mask, status, wr_id, start_poll, next_poll, end_poll, read_opcode, read_vendor_err, read_byte_len, read_imm_data, read_qp_num, read_src_qp, read_wc_flags, read_slid, read_sl, read_dlid_path_bits, read_completion_ts, read_cvlan, read_flow_tag, read_tm_info, read_completion_wallclock_ns }
        struct ibv_cq_init_attr_ex { cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain }
        struct ibv_poll_cq_attr { comp_mask }
        struct ibv_wc_tm_info { tag, priv => priv_ }
        struct ibv_data_buf { addr, length }
        struct rdma_event_channel { fd }
        struct rdma_ib_addr { sgid, dgid, pkey }
        struct rdma_addr { src_addr => src.addr, src_sin => src.sin, src_sin6 => src.sin6, src_storage => src.storage, dst_addr => dst.addr, dst_sin => dst.sin, dst_sin6 => dst.sin6, dst_storage => dst.storage, addr.ibaddr }
        struct ibv_sa_path_rec { dgid, sgid, dlid, slid, raw_traffic, flow_label, hop_limit, traffic_class, reversible, numb_path, pkey, sl, mtu_selector, mtu, rate_selector, rate, packet_life_time_selector, packet_life_time, preference }
        struct rdma_route { addr, path_rec, num_paths }
        struct rdma_cm_id { verbs, channel, context, qp, route, route.addr.src_addr => route.addr.src.addr, route.addr.dst_addr => route.addr.dst.addr, route.addr.addr.ibaddr.dgid => route.addr.addr.ibaddr.dgid, route.path_rec, route.num_paths, ps, port_num, event, send_cq_channel, send_cq, recv_cq_channel, recv_cq, srq, pd, qp_type }
        struct rdma_conn_param { private_data, private_data_len, responder_resources, initiator_depth, flow_control, retry_count, rnr_retry_count, srq, qp_num }
        struct rdma_ud_param { private_data, private_data_len, ah_attr, qp_num, qkey }
        struct rdma_cm_event { id, listen_id, event, status, param, param.conn.qp_num, param.ud.ah_attr, param.ud.qkey }
        struct rdma_addrinfo { ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len, ai_src_addr, ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len, ai_route, ai_connect_len, ai_connect, ai_next }
        struct rdma_cm_join_mc_attr_ex { comp_mask, join_flags, addr }
        struct ibv_rx_hash_conf { rx_hash_function, rx_hash_key_len, rx_hash_key, rx_hash_fields_mask }
        struct ibv_qp_init_attr_ex { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd, xrcd, create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf, source_qpn, send_ops_flags }
        struct ibv_tm_cap { max_num_tags, max_ops }
        struct ibv_srq_init_attr_ex { srq_context, attr, comp_mask, srq_type, pd, xrcd, cq, tm_cap }
    }
}

#[test]
fn abi_layouts_match_the_installed_headers() {
    if !common::have_headers() {
        return;
    }
    let list = layouts();
    let mut c = String::new();
    for h in HEADERS {
        c.push_str(&format!("#include <{h}>\n"));
    }
    c.push_str("#include <stdio.h>\n#include <stddef.h>\nint main(void) {\n");
    for l in &list {
        c.push_str(&format!(
            "  printf(\"{n} %zu %zu\\n\", sizeof({t}), _Alignof({t}));\n",
            n = l.name,
            t = l.c_type
        ));
        for (f, _) in &l.fields {
            let f = f.replace(' ', "");
            c.push_str(&format!(
                "  printf(\"{n}.{f} %zu\\n\", offsetof({t}, {f}));\n",
                n = l.name,
                t = l.c_type
            ));
        }
    }
    c.push_str("  return 0;\n}\n");
    let dir = common::target_dir().join("capi-layout");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let out = std::process::Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut c_side = BTreeMap::new();
    for line in text.lines() {
        let mut it = line.split(' ');
        let k = it.next().unwrap().to_string();
        let v: Vec<usize> = it.map(|x| x.parse().unwrap()).collect();
        c_side.insert(k, v);
    }
    let mut errors = Vec::new();
    for l in &list {
        let c = &c_side[l.name];
        if c[0] != l.size || c[1] != l.align {
            errors.push(format!(
                "{}: C size/align {}/{}, Rust {}/{}",
                l.name, c[0], c[1], l.size, l.align
            ));
        }
        for (f, off) in &l.fields {
            let key = format!("{}.{}", l.name, f.replace(' ', ""));
            if c_side[&key][0] != *off {
                errors.push(format!("{key}: C offset {}, Rust {off}", c_side[&key][0]));
            }
        }
    }
    assert!(
        errors.is_empty(),
        "layout mismatches:\n{}",
        errors.join("\n")
    );
}

#[test]
fn verbs_context_alloc_is_the_newest_layout() {
    assert_eq!(std::mem::size_of::<verbs_context_alloc>(), 696);
    assert_eq!(std::mem::offset_of!(verbs_context_alloc, vctx.context), 368);
    // Distances from the ibv_context measured in c_abi_notes.md (v44 and HEAD alike).
    assert_eq!(
        std::mem::offset_of!(verbs_context, context)
            - std::mem::offset_of!(verbs_context, query_port),
        320
    );
    assert_eq!(
        std::mem::offset_of!(verbs_context, context)
            - std::mem::offset_of!(verbs_context, create_qp_ex),
        56
    );
}
