/*
 * Memory windows over the drop-in libibverbs in one process: pairs of RC QPs on the
 * loopback device named by argv[1], A the peer and B the owner of the memory. B binds a
 * type 1 window (ibv_bind_mw) and type 2 windows (IBV_WR_BIND_MW through ibv_post_send, and
 * ibv_wr_bind_mw); A RDMA-writes through each; B invalidates (IBV_WR_LOCAL_INV, and A's
 * ibv_wr_send_inv, which B's receive reports with IBV_WC_WITH_INV); then A's write through
 * an invalidated or unbound rkey completes with IBV_WC_REM_ACCESS_ERR, as does a write
 * through a type 2 window that arrives on another QP than the one that bound it (type 2B),
 * while a type 1 window answers any QP of its PD. Also: the device
 * reports windows, ibv_dereg_mr fails with EINVAL while a window is bound, ibv_dealloc_mw.
 * Prints "mem_windows: ok" on success.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "test_util.h"

enum { BUF = 8192 };

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

struct pair {
	struct ibv_cq *cqa, *cqb;
	struct ibv_qp *qa, *qb;
};

static struct ibv_qp *make_qp(struct ibv_cq *cq)
{
	struct ibv_qp_init_attr_ex a;
	memset(&a, 0, sizeof(a));
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = 16;
	a.cap.max_recv_wr = 16;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	a.pd = pd;
	a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE |
			   IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV |
			   IBV_QP_EX_WITH_SEND_WITH_INV;
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &a);
	CHECK(qp, "ibv_create_qp_ex");
	return qp;
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest)
{
	connect_rc_qp(qp, dest, &gid, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
}

static struct pair make_pair(void)
{
	struct pair p;
	p.cqa = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	p.cqb = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	CHECK(p.cqa && p.cqb, "ibv_create_cq");
	p.qa = make_qp(p.cqa);
	p.qb = make_qp(p.cqb);
	connect_qp(p.qa, p.qb->qp_num);
	connect_qp(p.qb, p.qa->qp_num);
	return p;
}

/* The next completion of cq. */
static struct ibv_wc poll1(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	CHECK(n == 1, "ibv_poll_cq %d", n);
	return wc;
}

/* A posts an RDMA WRITE of len bytes of its buffer to addr under rkey; its status. */
static enum ibv_wc_status write_through(struct pair *p, struct ibv_mr *a_mr, uint64_t addr,
					uint32_t rkey, uint32_t len)
{
	struct ibv_sge s = { (uintptr_t)a_mr->addr, len, a_mr->lkey };
	struct ibv_send_wr w, *bad;
	memset(&w, 0, sizeof(w));
	w.wr_id = 500;
	w.sg_list = &s;
	w.num_sge = 1;
	w.opcode = IBV_WR_RDMA_WRITE;
	w.send_flags = IBV_SEND_SIGNALED;
	w.wr.rdma.remote_addr = addr;
	w.wr.rdma.rkey = rkey;
	CHECK(!ibv_post_send(p->qa, &w, &bad), "ibv_post_send WRITE");
	struct ibv_wc wc = poll1(p->cqa);
	CHECK(wc.wr_id == 500 && (wc.opcode == IBV_WC_RDMA_WRITE || wc.status != IBV_WC_SUCCESS),
	      "write completion");
	return wc.status;
}

static void expect_ok(struct ibv_wc wc, uint64_t wr_id, enum ibv_wc_opcode op, const char *what)
{
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == wr_id && wc.opcode == op,
	      "%s: wr_id %llu status %s opcode %d", what, (unsigned long long)wc.wr_id,
	      ibv_wc_status_str(wc.status), wc.opcode);
}

int main(int argc, char **argv)
{
	CHECK(argc == 2, "usage: mem_windows DEVICE");
	struct ibv_device **list;
	ctx = open_device_named(argv[1], &list);
	ibv_free_device_list(list);
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "ibv_query_gid");

	/* What a program checks before it uses windows. */
	struct ibv_device_attr da;
	CHECK(!ibv_query_device(ctx, &da), "ibv_query_device");
	CHECK(da.max_mw > 0 && (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW) &&
	      (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B),
	      "max_mw %d cap flags %#x", da.max_mw, da.device_cap_flags);

	pd = ibv_alloc_pd(ctx);
	CHECK(pd, "ibv_alloc_pd");
	char *a_buf = calloc(1, BUF), *b_buf = calloc(1, BUF);
	struct ibv_mr *a_mr = ibv_reg_mr(pd, a_buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	/* B's region grants no remote access itself: only the windows do. */
	struct ibv_mr *b_mr = ibv_reg_mr(pd, b_buf, BUF, IBV_ACCESS_LOCAL_WRITE |
					 IBV_ACCESS_MW_BIND);
	CHECK(a_mr && b_mr, "ibv_reg_mr");
	struct pair p = make_pair();

	/* Type 1: ibv_bind_mw, the rkey's key byte goes up by one. */
	struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	CHECK(mw1 && mw1->type == IBV_MW_TYPE_1 && mw1->pd == pd, "ibv_alloc_mw type 1");
	uint32_t old = mw1->rkey;
	struct ibv_mw_bind b1 = {
		.wr_id = 1,
		.send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = b_mr, .addr = (uintptr_t)b_buf + 256, .length = 256,
			       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE },
	};
	CHECK(ibv_bind_mw(p.qb, mw1, &b1) == 0, "ibv_bind_mw");
	CHECK(mw1->rkey == ibv_inc_rkey(old), "type 1 rkey %#x after %#x", mw1->rkey, old);
	expect_ok(poll1(p.cqb), 1, IBV_WC_BIND_MW, "type 1 bind");
	strcpy(a_buf, "type 1 window");
	CHECK(write_through(&p, a_mr, (uintptr_t)b_buf + 256, mw1->rkey, 14) == IBV_WC_SUCCESS,
	      "write through the type 1 window");
	CHECK(!strcmp(b_buf + 256, "type 1 window"), "type 1 data: %s", b_buf + 256);
	errno = 0;
	CHECK(ibv_dereg_mr(b_mr) == EINVAL, "ibv_dereg_mr with a bound window");

	/* Type 2 through ibv_post_send(IBV_WR_BIND_MW), under an rkey B chooses. */
	struct ibv_mw *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw2 && mw2->type == IBV_MW_TYPE_2, "ibv_alloc_mw type 2");
	uint32_t k2 = ibv_inc_rkey(mw2->rkey);
	struct ibv_send_wr w, *bad;
	memset(&w, 0, sizeof(w));
	w.wr_id = 2;
	w.opcode = IBV_WR_BIND_MW;
	w.send_flags = IBV_SEND_SIGNALED;
	w.bind_mw.mw = mw2;
	w.bind_mw.rkey = k2;
	w.bind_mw.bind_info.mr = b_mr;
	w.bind_mw.bind_info.addr = (uintptr_t)b_buf + 1024;
	w.bind_mw.bind_info.length = 512;
	w.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	CHECK(!ibv_post_send(p.qb, &w, &bad), "ibv_post_send BIND_MW");
	expect_ok(poll1(p.cqb), 2, IBV_WC_BIND_MW, "type 2 bind");
	CHECK(mw2->rkey == k2, "type 2 rkey %#x, asked for %#x", mw2->rkey, k2);
	strcpy(a_buf, "type 2 window");
	CHECK(write_through(&p, a_mr, (uintptr_t)b_buf + 1024, k2, 14) == IBV_WC_SUCCESS,
	      "write through the type 2 window");
	CHECK(!strcmp(b_buf + 1024, "type 2 window"), "type 2 data");

	/* IBV_WR_LOCAL_INV. */
	memset(&w, 0, sizeof(w));
	w.wr_id = 3;
	w.opcode = IBV_WR_LOCAL_INV;
	w.send_flags = IBV_SEND_SIGNALED;
	w.invalidate_rkey = k2;
	CHECK(!ibv_post_send(p.qb, &w, &bad), "ibv_post_send LOCAL_INV");
	expect_ok(poll1(p.cqb), 3, IBV_WC_LOCAL_INV, "local invalidate");

	/* Rebound with ibv_wr_bind_mw under the next key, reached, then invalidated by A's
	 * ibv_wr_send_inv. */
	uint32_t k3 = ibv_inc_rkey(k2);
	struct ibv_qp_ex *xb = ibv_qp_to_qp_ex(p.qb), *xa = ibv_qp_to_qp_ex(p.qa);
	CHECK(xa && xb, "ibv_qp_to_qp_ex");
	struct ibv_mw_bind_info bi = { .mr = b_mr, .addr = (uintptr_t)b_buf + 2048,
				       .length = 2048, .mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
	ibv_wr_start(xb);
	xb->wr_id = 4;
	xb->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(xb, mw2, k3, &bi);
	CHECK(ibv_wr_complete(xb) == 0, "ibv_wr_complete bind");
	expect_ok(poll1(p.cqb), 4, IBV_WC_BIND_MW, "ibv_wr_bind_mw");
	CHECK(mw2->rkey == k3, "rkey after ibv_wr_bind_mw");
	strcpy(a_buf, "rebound");
	CHECK(write_through(&p, a_mr, (uintptr_t)b_buf + 3000, k3, 8) == IBV_WC_SUCCESS,
	      "write through the rebound window");
	CHECK(!strcmp(b_buf + 3000, "rebound"), "rebound data");
	struct ibv_sge rs = { (uintptr_t)b_buf + 6000, 100, b_mr->lkey };
	struct ibv_recv_wr r = { .wr_id = 5, .sg_list = &rs, .num_sge = 1 }, *rbad;
	CHECK(!ibv_post_recv(p.qb, &r, &rbad), "ibv_post_recv");
	ibv_wr_start(xa);
	xa->wr_id = 6;
	xa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_inv(xa, k3);
	ibv_wr_set_sge(xa, a_mr->lkey, (uintptr_t)a_buf, 8);
	CHECK(ibv_wr_complete(xa) == 0, "ibv_wr_complete send_inv");
	expect_ok(poll1(p.cqa), 6, IBV_WC_SEND, "send with invalidate");
	struct ibv_wc wc = poll1(p.cqb);
	expect_ok(wc, 5, IBV_WC_RECV, "receive of the send with invalidate");
	CHECK((wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == k3,
	      "wc_flags %#x invalidated_rkey %#x", wc.wc_flags, wc.invalidated_rkey);

	/* The invalidated rkey is refused: a remote access error at A. */
	CHECK(write_through(&p, a_mr, (uintptr_t)b_buf + 3000, k3, 8) == IBV_WC_REM_ACCESS_ERR,
	      "write through an invalidated window");

	/* Type 2B on fresh pairs: the window answers only the QP that bound it. */
	struct pair q = make_pair(), o = make_pair();
	uint32_t k4 = ibv_inc_rkey(k3);
	memset(&w, 0, sizeof(w));
	w.wr_id = 8;
	w.opcode = IBV_WR_BIND_MW;
	w.send_flags = IBV_SEND_SIGNALED;
	w.bind_mw.mw = mw2;
	w.bind_mw.rkey = k4;
	w.bind_mw.bind_info.mr = b_mr;
	w.bind_mw.bind_info.addr = (uintptr_t)b_buf + 4096;
	w.bind_mw.bind_info.length = 1024;
	w.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	CHECK(!ibv_post_send(q.qb, &w, &bad), "ibv_post_send BIND_MW on another QP");
	expect_ok(poll1(q.cqb), 8, IBV_WC_BIND_MW, "type 2 rebind");
	CHECK(write_through(&q, a_mr, (uintptr_t)b_buf + 4096, k4, 8) == IBV_WC_SUCCESS,
	      "write through the QP that bound the window");
	CHECK(write_through(&o, a_mr, (uintptr_t)b_buf + 4096, k4, 8) == IBV_WC_REM_ACCESS_ERR,
	      "write through another QP of the PD");

	/* The type 1 window answers any QP of its PD; unbound by a zero-length bind, it
	 * refuses A too. */
	uint32_t k1 = mw1->rkey;
	CHECK(write_through(&q, a_mr, (uintptr_t)b_buf + 256, k1, 8) == IBV_WC_SUCCESS,
	      "a type 1 window answers any QP of its PD");
	struct ibv_mw_bind unbind = { .wr_id = 7, .send_flags = IBV_SEND_SIGNALED };
	CHECK(ibv_bind_mw(q.qb, mw1, &unbind) == 0, "ibv_bind_mw (unbind)");
	expect_ok(poll1(q.cqb), 7, IBV_WC_BIND_MW, "type 1 unbind");
	CHECK(write_through(&q, a_mr, (uintptr_t)b_buf + 256, mw1->rkey, 8) ==
	      IBV_WC_REM_ACCESS_ERR, "write through an unbound window");

	/* No window is bound now: the region deregisters. */
	CHECK(ibv_dealloc_mw(mw1) == 0 && ibv_dealloc_mw(mw2) == 0, "ibv_dealloc_mw");
	CHECK(ibv_dereg_mr(b_mr) == 0, "ibv_dereg_mr");
	printf("mem_windows: ok\n");
	return 0;
}
