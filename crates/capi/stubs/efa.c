/*
 * Stand-in libefa.so.1 for softrdma: no EFA device ever exists here.
 *
 * Debian's perftest binaries are linked against libefa.so.1 (EFA Direct Verbs) with BIND_NOW,
 * so the efadv_* names they import must resolve under their version nodes, although they are
 * only called for EFA's SRD transport. The real libefa is an rdma-core provider needing
 * libibverbs' private provider ABI, which softrdma's libibverbs.so.1 does not offer. Every
 * function reports "not supported" (EOPNOTSUPP; NULL from constructors).
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

/* EFA device attributes: not an EFA device. */
int efadv_query_device(void *context, void *attr, uint32_t inlen)
{
	(void)context; (void)attr; (void)inlen;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

/* SRD QPs: not available. */
void *efadv_create_qp_ex(void *context, void *attr_ex, void *efa_attr, uint32_t inlen)
{
	(void)context; (void)attr_ex; (void)efa_attr; (void)inlen;
	errno = EOPNOTSUPP;
	return NULL;
}

/* Driver QPs (the EFA_1.0 SRD constructor): not available. */
void *efadv_create_driver_qp(void *pd, void *attr, uint32_t driver_qp_type)
{
	(void)pd; (void)attr; (void)driver_qp_type;
	errno = EOPNOTSUPP;
	return NULL;
}

/* EFA address handle attributes: not an EFA address handle. */
int efadv_query_ah(void *ah, void *attr, uint32_t inlen)
{
	(void)ah; (void)attr; (void)inlen;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

/* EFA CQs: not available. */
void *efadv_create_cq(void *context, void *attr_ex, void *efa_attr, uint32_t inlen)
{
	(void)context; (void)attr_ex; (void)efa_attr; (void)inlen;
	errno = EOPNOTSUPP;
	return NULL;
}

/* No ibv_cq_ex is an EFA one. */
void *efadv_cq_from_ibv_cq_ex(void *cq)
{
	(void)cq;
	errno = EOPNOTSUPP;
	return NULL;
}
