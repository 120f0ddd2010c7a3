//! Layout sanity of the structs the hot path and discovery touch. The
//! figures come from gcc 12 on x86_64 over the same vendored rdma-core 44.0
//! headers (`sizeof`/`offsetof`), so a bindgen or header change that moves
//! a field fails here. x86_64 Linux only: elsewhere glibc's pthread types
//! (taken from the `libc` crate) have other sizes, which moves later fields.
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use core::mem::{align_of, offset_of, size_of};

use orbitte_verbs_sys::bindings::*;

#[test]
fn work_completion_matches_c() {
    assert_eq!(size_of::<ibv_wc>(), 48);
    assert_eq!(align_of::<ibv_wc>(), 8);
    assert_eq!(offset_of!(ibv_wc, status), 8);
    assert_eq!(offset_of!(ibv_wc, opcode), 12);
    assert_eq!(offset_of!(ibv_wc, byte_len), 20);
    assert_eq!(offset_of!(ibv_wc, qp_num), 28);
    assert_eq!(offset_of!(ibv_wc, wc_flags), 36);
    assert_eq!(offset_of!(ibv_wc, dlid_path_bits), 45);
}

#[test]
fn work_requests_match_c() {
    assert_eq!(size_of::<ibv_sge>(), 16);
    assert_eq!(size_of::<ibv_send_wr>(), 128);
    assert_eq!(offset_of!(ibv_send_wr, sg_list), 16);
    assert_eq!(offset_of!(ibv_send_wr, opcode), 28);
    assert_eq!(offset_of!(ibv_send_wr, send_flags), 32);
    assert_eq!(offset_of!(ibv_send_wr, wr), 40);
    assert_eq!(offset_of!(ibv_send_wr, qp_type), 72);
    assert_eq!(size_of::<ibv_recv_wr>(), 32);
}

#[test]
fn context_and_ops_table_match_c() {
    assert_eq!(size_of::<ibv_context>(), 328);
    assert_eq!(offset_of!(ibv_context, ops), 8);
    assert_eq!(offset_of!(ibv_context, cmd_fd), 264);
    assert_eq!(offset_of!(ibv_context, mutex), 280);
    assert_eq!(offset_of!(ibv_context, abi_compat), 320);
    assert_eq!(size_of::<ibv_context_ops>(), 256);
    assert_eq!(offset_of!(ibv_context_ops, poll_cq), 88);
    assert_eq!(offset_of!(ibv_context_ops, req_notify_cq), 96);
    assert_eq!(offset_of!(ibv_context_ops, post_send), 200);
    assert_eq!(offset_of!(ibv_context_ops, post_recv), 208);
    assert_eq!(size_of::<verbs_context>(), 648);
    assert_eq!(offset_of!(verbs_context, query_port), 0);
    assert_eq!(offset_of!(verbs_context, sz), 312);
    assert_eq!(offset_of!(verbs_context, context), 320);
}

#[test]
fn queue_objects_match_c() {
    assert_eq!(size_of::<ibv_qp>(), 160);
    assert_eq!(offset_of!(ibv_qp, context), 0);
    assert_eq!(offset_of!(ibv_qp, qp_num), 52);
    assert_eq!(offset_of!(ibv_qp, state), 56);
    assert_eq!(offset_of!(ibv_qp, mutex), 64);
    assert_eq!(size_of::<ibv_cq>(), 128);
    assert_eq!(offset_of!(ibv_cq, context), 0);
    assert_eq!(offset_of!(ibv_cq, cqe), 28);
    assert_eq!(offset_of!(ibv_cq, mutex), 32);
    assert_eq!(offset_of!(ibv_cq, cond), 72);
    assert_eq!(size_of::<ibv_mr>(), 48);
    assert_eq!(offset_of!(ibv_mr, lkey), 36);
    assert_eq!(offset_of!(ibv_mr, rkey), 40);
}

#[test]
fn attributes_match_c() {
    assert_eq!(size_of::<ibv_port_attr>(), 52);
    assert_eq!(align_of::<ibv_port_attr>(), 4);
    assert_eq!(offset_of!(ibv_port_attr, link_layer), 46);
    assert_eq!(offset_of!(ibv_port_attr, flags), 47);
    assert_eq!(offset_of!(ibv_port_attr, port_cap_flags2), 48);
    assert_eq!(size_of::<ibv_device_attr>(), 232);
    assert_eq!(offset_of!(ibv_device_attr, phys_port_cnt), 227);
    assert_eq!(size_of::<ibv_qp_attr>(), 144);
    assert_eq!(offset_of!(ibv_qp_attr, ah_attr), 56);
    assert_eq!(offset_of!(ibv_qp_attr, rate_limit), 136);
    assert_eq!(size_of::<ibv_qp_init_attr>(), 64);
    assert_eq!(size_of::<ibv_gid_entry>(), 32);
    assert_eq!(size_of::<ibv_async_event>(), 16);
    assert_eq!(size_of::<ibv_gid>(), 16);
}

#[test]
fn enum_constants_keep_c_values() {
    assert_eq!(IBV_WC_SUCCESS, 0);
    assert_eq!(IBV_WC_RETRY_EXC_ERR, 12);
    assert_eq!(IBV_WR_RDMA_WRITE, 0);
    assert_eq!(IBV_WR_RDMA_READ, 4);
    assert_eq!(IBV_SEND_SIGNALED, 2);
    assert_eq!(IBV_QPT_RC, 2);
    assert_eq!(IBV_QPS_RTS, 3);
    assert_eq!(IBV_ACCESS_REMOTE_READ, 4);
    assert_eq!(IBV_LINK_LAYER_ETHERNET, 2);
    assert_eq!(IBV_GID_TYPE_ROCE_V2, 2);
}
