/* The launcher's environment and command lines (resil/launch.c): on one
 * machine OpenMPI is pinned to loopback and ob1; inside a Slurm allocation
 * neither (the ranks are on several hosts: OpenMPI picks their interfaces),
 * and a setting the user made is never replaced; mpirun locally, srun with
 * --mpi=pmix and --kill-on-bad-exit in Slurm, nodes and node list passed. */
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
    return test_summary("test_launch");
}
