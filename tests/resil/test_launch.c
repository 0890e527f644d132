/* The launcher's environment and command lines (resil/launch.c): on one
 * machine OpenMPI is pinned to loopback and ob1; inside a Slurm allocation
 * neither (the ranks are on several hosts: OpenMPI picks their interfaces),
 * and a setting the user made is never replaced; mpirun locally, srun with
 * --mpi=pmix and --kill-on-bad-exit in Slurm, nodes and node list passed.
 * Commands run from argv (keel_run_collect, keel_run_capture): the streams
 * asked for are kept (up to a bound, the rest dropped and said so), a program
 * that cannot be run is told apart by its errno, a time limit kills it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "keel/resil.h"

#include "../testlib.h"

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v ? v : "(unset)";
}

static void clear(void) {
    unsetenv("SLURM_JOB_ID");
    unsetenv("OMPI_MCA_btl_tcp_if_include");
    unsetenv("OMPI_MCA_oob_tcp_if_include");
    unsetenv("OMPI_MCA_pml");
    unsetenv("OMPI_MCA_orte_default_hostfile");
    unsetenv("PRTE_MCA_prte_default_hostfile");
    unsetenv("OMPI_MCA_btl_vader_backing_directory");
}

static bool has(char **argv, const char *arg) {
    for (int i = 0; argv[i]; i++)
        if (!strcmp(argv[i], arg)) return true;
    return false;
}

static void test_run_collect(void) {
    char *both[] = {"sh", "-c", "printf out; printf 'err\\nmore' >&2; exit 3", NULL};
    keel_run_output o;
    int code = keel_run_collect(both, 10, KEEL_RUN_STDOUT | KEEL_RUN_STDERR, 1024, &o);
    EXPECT(code == 3 && !strcmp(o.out, "out") && !strcmp(o.err, "err\nmore") && !o.exec_errno && !o.out_cut,
           "both streams kept, the exit code passed on (%d, '%s', '%s')", code, o.out, o.err);
    keel_run_output_free(&o);
    char *big[] = {"sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x", NULL};
    code = keel_run_collect(big, 10, KEEL_RUN_STDOUT, 10, &o);
    EXPECT(code == 0 && !strcmp(o.out, "xxxxxxxxxx") && o.out_cut && !o.err[0],
           "stdout past max_bytes read and dropped, and said so (%d, '%s')", code, o.out);
    keel_run_output_free(&o);
    char *missing[] = {"/nonexistent/kubectl", "version", NULL};
    code = keel_run_collect(missing, 10, KEEL_RUN_STDERR, 1024, &o);
    EXPECT(code == 127 && o.exec_errno == ENOENT, "a program that is not there: 127 and ENOENT (%d, errno %d)", code,
           o.exec_errno);
    keel_run_output_free(&o);
    char *slow[] = {"sleep", "30", NULL};
    double t0 = keel_now_s();
    code = keel_run_collect(slow, 0.3, KEEL_RUN_STDOUT, 16, &o);
    EXPECT(code == 124 && keel_now_s() - t0 < 5, "a time limit kills it: 124 after %.1f s", keel_now_s() - t0);
    keel_run_output_free(&o);
    char out[4], *longer[] = {"sh", "-c", "printf output; exit 3", NULL};
    code = keel_run_capture(longer, 10, out, sizeof out);
    EXPECT(code == 3 && !strcmp(out, "out"), "keel_run_capture keeps n - 1 bytes of stdout (%d, '%s')", code, out);
}

int main(void) {
    clear();
    keel_launch_env();
    EXPECT(!strcmp(env("OMPI_MCA_btl_tcp_if_include"), "lo") && !strcmp(env("OMPI_MCA_oob_tcp_if_include"), "lo") &&
               !strcmp(env("OMPI_MCA_pml"), "ob1"),
           "one machine: loopback and ob1 (btl %s, oob %s, pml %s)", env("OMPI_MCA_btl_tcp_if_include"),
           env("OMPI_MCA_oob_tcp_if_include"), env("OMPI_MCA_pml"));
    const char *args[] = {"worker", "RUN", NULL};
    keel_launch_spec spec = {.nproc = 4};
    char **argv = keel_launch_argv("/bin/keel", &spec, args);
    EXPECT(!strcmp(argv[0], "mpirun") && has(argv, "-np") && has(argv, "4") && has(argv, "worker"),
           "one machine: mpirun -np 4 ... worker RUN");
    keel_launch_argv_free(argv);

    clear();
    setenv("SLURM_JOB_ID", "42", 1);
    keel_launch_env();
    EXPECT(!getenv("OMPI_MCA_btl_tcp_if_include") && !getenv("OMPI_MCA_oob_tcp_if_include") && !getenv("OMPI_MCA_pml"),
           "in Slurm: no loopback pinning, OpenMPI's own choice (btl %s, oob %s, pml %s)",
           env("OMPI_MCA_btl_tcp_if_include"), env("OMPI_MCA_oob_tcp_if_include"), env("OMPI_MCA_pml"));
    keel_launch_spec nodes = {.nproc = 4, .nodes = 2, .nodelist = "n1,n3"};
    argv = keel_launch_argv("/bin/keel", &nodes, args);
    EXPECT(!strcmp(argv[0], "srun") && has(argv, "--mpi=pmix") && has(argv, "--kill-on-bad-exit=1") &&
               has(argv, "n1,n3") && has(argv, "2"),
           "in Slurm: srun --mpi=pmix --kill-on-bad-exit=1 -N 2 -w n1,n3");
    keel_launch_argv_free(argv);

    clear();
    setenv("SLURM_JOB_ID", "42", 1);
    setenv("OMPI_MCA_btl_tcp_if_include", "ib0", 1);
    keel_launch_env();
    EXPECT(!strcmp(env("OMPI_MCA_btl_tcp_if_include"), "ib0"), "the user's interface stays: %s",
           env("OMPI_MCA_btl_tcp_if_include"));
    clear();
    setenv("OMPI_MCA_btl_tcp_if_include", "eth1", 1);
    keel_launch_env();
    EXPECT(!strcmp(env("OMPI_MCA_btl_tcp_if_include"), "eth1"), "one machine, the user's interface stays: %s",
           env("OMPI_MCA_btl_tcp_if_include"));

    /* a Kubeflow MPIJob's launcher: mpirun over the operator's hostfile spans the worker pods */
    const char *hostfiles[] = {"OMPI_MCA_orte_default_hostfile", "PRTE_MCA_prte_default_hostfile"};
    for (int i = 0; i < 2; i++) {
        clear();
        setenv(hostfiles[i], "/etc/mpi/hostfile", 1);
        keel_launch_env();
        EXPECT(!getenv("OMPI_MCA_btl_tcp_if_include") && !getenv("OMPI_MCA_oob_tcp_if_include") &&
                   !getenv("OMPI_MCA_pml"),
               "%s set: no loopback pinning (btl %s, oob %s, pml %s)", hostfiles[i],
               env("OMPI_MCA_btl_tcp_if_include"), env("OMPI_MCA_oob_tcp_if_include"), env("OMPI_MCA_pml"));
        char dir[128];
        keel_launch_shm_begin(dir, sizeof dir);
        EXPECT(!dir[0] && !getenv("OMPI_MCA_btl_vader_backing_directory"),
               "%s set: no shared-memory directory of this host's named to the others", hostfiles[i]);
    }
    clear();
    test_run_collect();
    return test_summary("test_launch");
}
