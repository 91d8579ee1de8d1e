/*
 * MPI ping-pong between ranks 0 and 1 (scripts/probes/mpi_lat.sh): for each size, 2 rounds
 * of ITERS (default 5000; the first sets the size up), then rank 0 prints the one-way time
 * of the second (round trip / 2): median, mean and 99th percentile, in µs.
 *   mpirun -np 2 mpi_pingpong [ITERS]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	static const int sizes[] = {8, 64, 512, 4096, 65536, 1 << 20};
	int rank, iters;
	char *buf = malloc(1 << 20);
	double *t;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	iters = argc > 1 ? atoi(argv[1]) : 5000;
	t = malloc(iters * sizeof(double));
	for (int s = 0; s < (int)(sizeof(sizes) / sizeof(sizes[0])); s++) {
		int len = sizes[s], n = len >= 65536 ? iters / 10 + 1 : iters;
		for (int round = 0; round < 2; round++) {
			double sum = 0;
			for (int i = 0; i < n; i++) {
				double t0 = MPI_Wtime();
				if (rank == 0) {
					MPI_Send(buf, len, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
					MPI_Recv(buf, len, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				} else if (rank == 1) {
					MPI_Recv(buf, len, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
					MPI_Send(buf, len, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
				}
				t[i] = (MPI_Wtime() - t0) / 2 * 1e6;
				sum += t[i];
			}
			qsort(t, n, sizeof(double), cmp);
			if (rank == 0 && round == 1)
				printf("%d B: p50 %.3f mean %.3f p99 %.3f us\n", len, t[n / 2], sum / n,
				       t[n * 99 / 100]);
		}
	}
	MPI_Finalize();
	return 0;
}
