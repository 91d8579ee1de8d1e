/*
 * Stand-in libmlx5.so.1 for softrdma: no mlx5 device ever exists here.
 *
 * Debian's perftest binaries are linked against libmlx5.so.1 (mlx5 Direct Verbs) and load it
 * with BIND_NOW, so every mlx5dv_* name they import must resolve under its version node even
 * though they only call it for mlx5-only features (DC transport, AES-XTS, DevX queries).
 * The real libmlx5 is an rdma-core provider that needs libibverbs' private provider ABI
 * (IBVERBS_PRIVATE_*), which softrdma's libibverbs.so.1 does not offer. Every function here
 * reports "not supported": probes say no, constructors return NULL with errno EOPNOTSUPP,
 * the others return EOPNOTSUPP, so a program takes the generic verbs path.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* No device is an mlx5 device. */
bool mlx5dv_is_supported(void *device) { (void)device; return false; }

/* Opening a device through mlx5 DV: not available. */
void *mlx5dv_open_device(void *device, void *attr)
{
	(void)device; (void)attr;
	errno = EOPNOTSUPP;
	return NULL;
}

/* mlx5 QPs (DC, crypto): not available. */
void *mlx5dv_create_qp(void *context, void *qp_attr, void *mlx5_qp_attr)
{
	(void)context; (void)qp_attr; (void)mlx5_qp_attr;
	errno = EOPNOTSUPP;
	return NULL;
}

/* No ibv_qp_ex is an mlx5 one. */
void *mlx5dv_qp_ex_from_ibv_qp_ex(void *qp)
{
	(void)qp;
	errno = EOPNOTSUPP;
	return NULL;
}

/* DevX firmware commands: not available. */
int mlx5dv_devx_general_cmd(void *context, const void *in, size_t inlen, void *out,
			    size_t outlen)
{
	(void)context; (void)in; (void)inlen; (void)out; (void)outlen;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

/* Indirect mkeys: not available. */
void *mlx5dv_create_mkey(void *mkey_init_attr)
{
	(void)mkey_init_attr;
	errno = EOPNOTSUPP;
	return NULL;
}

/* Nothing to destroy: no mkey was ever made. */
int mlx5dv_destroy_mkey(void *mkey)
{
	(void)mkey;
	return EOPNOTSUPP;
}

/* Crypto login: not available. */
int mlx5dv_crypto_login(void *context, void *login_attr)
{
	(void)context; (void)login_attr;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

/* Data encryption keys: not available. */
void *mlx5dv_dek_create(void *context, void *init_attr)
{
	(void)context; (void)init_attr;
	errno = EOPNOTSUPP;
	return NULL;
}

/* Nothing to destroy: no key was ever made. */
int mlx5dv_dek_destroy(void *dek)
{
	(void)dek;
	return EOPNOTSUPP;
}
