/* Cluster specs (keel/cluster.h): the example parses into the nodes, roles
 * and addresses it describes; every bad spec is refused with one line that
 * names the key; a hosts file maps real hosts onto the groups; slurm.conf
 * for this machine's cluster and for real hosts says what each needs. */
#include <stdio.h>
#include <string.h>

#include "keel/cluster.h"

#include "../testlib.h"

static char dir[256], spec_path[300];

/* Parse text as the spec file in dir; the error line when it fails. */
static keel_status parse(const char *text, keel_cluster_spec *s, const char **err) {
    capture_begin();
    keel_status st = keel_cluster_spec_parse(text, spec_path, s);
    *err = capture_end();
    return st;
}

#define GROUPS_OK                                                                                                  \
    "\"InstanceGroups\": [{\"InstanceGroupName\": \"ctl\", \"Role\": \"controller\", \"InstanceCount\": 1},"       \
    " {\"InstanceGroupName\": \"gpu\", \"Role\": \"worker\", \"InstanceCount\": 2, \"Gpus\": 8, \"Cpus\": 96}]"

static void expect_refused(const char *name, const char *text, const char *want) {
    keel_cluster_spec s;
    const char *err;
    keel_status st = parse(text, &s, &err);
    int lines = 0;
    for (const char *c = err; *c; c++) lines += *c == '\n';
    EXPECT(st == KEEL_ERR_INPUT && lines == 1 && strstr(err, want) && strstr(err, spec_path),
           "%s: refused in one line naming the file and '%s' (got: %.*s)", name, want, (int)strcspn(err, "\n"), err);
    if (st == KEEL_OK) keel_cluster_spec_free(&s);
}

static void test_example(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/examples/cluster-local.json", getenv("KEEL_SRC") ? getenv("KEEL_SRC") : ".");
    keel_cluster_spec s;
    keel_status st = keel_cluster_spec_load(path, &s);
    EXPECT(st == KEEL_OK, "examples/cluster-local.json parses");
    if (st != KEEL_OK) return;
    EXPECT(s.nnodes == 6 && !strcmp(s.nodes[0].name, "controller1") && !strcmp(s.nodes[1].name, "login1") &&
               !strcmp(s.nodes[2].name, "worker1") && !strcmp(s.nodes[5].name, "worker4"),
           "1 controller, 1 login, 4 workers: controller1 login1 worker1..worker4");
    EXPECT(!strcmp(s.nodes[0].addr, "10.213.0.2") && !strcmp(s.nodes[5].addr, "10.213.0.7"),
           "addresses from the subnet, .1 left to the bridge: %s .. %s", s.nodes[0].addr, s.nodes[5].addr);
    EXPECT(s.groups[0].on_create && s.groups[0].on_create[0] == '/' && strstr(s.groups[0].on_create, "lifecycle/on_create.sh"),
           "OnCreate resolved against the spec's directory: %s", s.groups[0].on_create);
    char conf[] = "/etc/keel-test", keel[] = "/opt/keel/bin/keel", plugin[] = "/opt/keel/lib/keel/keel_auto_resume.so";
    keel_cluster_files f = {.local = true, .conf_dir = s.state_dir, .keel = keel, .plugin = plugin};
    char *text = keel_cluster_slurm_conf(&s, &f);
    EXPECT(strstr(text, "SlurmctldHost=controller1(10.213.0.2)\n") && strstr(text, "AuthType=auth/munge\n") &&
               strstr(text, "NodeName=worker3 NodeAddr=10.213.0.6 NodeHostname=worker3 CPUs=4 RealMemory=4000\n") &&
               strstr(text, "PartitionName=dev Nodes=worker1,worker2,worker3,worker4 Default=YES") &&
               strstr(text, "AuthInfo=socket=/var/lib/keel/cluster/keel-local/munge/munge.sock") &&
               strstr(text, "ProctrackType=proctrack/linuxproc") && !strstr(text, "NodeName=login1") &&
               strstr(text, "Epilog=/var/lib/keel/cluster/keel-local/keel-health.sh\n"),
           "local slurm.conf: controller by address, munge socket in StateDir, workers only in the partition");
    keel_free(text);
    (void)conf;
    keel_cluster_spec_free(&s);
}

static void test_refusals(void) {
    expect_refused("not JSON", "{", "not valid JSON");
    expect_refused("unknown key", "{\"ClusterName\": \"a\", \"Instancegroups\": []}", "unknown key 'Instancegroups'");
    expect_refused("bad name", "{\"ClusterName\": \"A b\", " GROUPS_OK "}", "ClusterName");
    expect_refused("no groups", "{\"ClusterName\": \"a\"}", "InstanceGroups");
    expect_refused("no controller",
                   "{\"ClusterName\": \"a\", \"InstanceGroups\": [{\"InstanceGroupName\": \"w\", \"Role\": \"worker\", "
                   "\"InstanceCount\": 2}]}",
                   "no group with Role \"controller\"");
    expect_refused("zero workers",
                   "{\"ClusterName\": \"a\", \"InstanceGroups\": [{\"InstanceGroupName\": \"c\", \"Role\": "
                   "\"controller\", \"InstanceCount\": 1}, {\"InstanceGroupName\": \"w\", \"Role\": \"worker\", "
                   "\"InstanceCount\": 0}]}",
                   "InstanceCount: 0 nodes");
    expect_refused("no worker group",
                   "{\"ClusterName\": \"a\", \"InstanceGroups\": [{\"InstanceGroupName\": \"c\", \"Role\": "
                   "\"controller\", \"InstanceCount\": 1}]}",
                   "no worker nodes");
    expect_refused("two controllers",
                   "{\"ClusterName\": \"a\", \"InstanceGroups\": [{\"InstanceGroupName\": \"c\", \"Role\": "
                   "\"controller\", \"InstanceCount\": 2}]}",
                   "a cluster has exactly one");
    expect_refused("unknown role",
                   "{\"ClusterName\": \"a\", \"InstanceGroups\": [{\"InstanceGroupName\": \"c\", \"Role\": "
                   "\"head\", \"InstanceCount\": 1}]}",
                   "Role: want");
    expect_refused("unknown group key",
                   "{\"ClusterName\": \"a\", \"InstanceGroups\": [{\"InstanceGroupName\": \"c\", \"Role\": "
                   "\"controller\", \"InstanceCount\": 1, \"InstanceType\": \"ml.p5.48xlarge\"}]}",
                   "unknown key 'InstanceType'");
    expect_refused("missing lifecycle script",
                   "{\"ClusterName\": \"a\", \"InstanceGroups\": [{\"InstanceGroupName\": \"c\", \"Role\": "
                   "\"controller\", \"InstanceCount\": 1, \"LifeCycleConfig\": {\"OnCreate\": \"nope.sh\"}}]}",
                   "OnCreate: ");
    expect_refused("hardware on a controller",
                   "{\"ClusterName\": \"a\", \"InstanceGroups\": [{\"InstanceGroupName\": \"c\", \"Role\": "
                   "\"controller\", \"InstanceCount\": 1, \"Gpus\": 8}]}",
                   "only worker groups");
    expect_refused("duplicate node names",
                   "{\"ClusterName\": \"a\", \"InstanceGroups\": [{\"InstanceGroupName\": \"c\", \"Role\": "
                   "\"controller\", \"InstanceCount\": 1}, {\"InstanceGroupName\": \"w\", \"Role\": \"worker\", "
                   "\"InstanceCount\": 11}, {\"InstanceGroupName\": \"w1\", \"Role\": \"worker\", \"InstanceCount\": 1}]}",
                   "two nodes would be named w11");
    expect_refused("public subnet", "{\"ClusterName\": \"a\", " GROUPS_OK ", \"Subnet\": \"8.8.8.0/24\"}",
                   "not a private range");
    expect_refused("bad subnet", "{\"ClusterName\": \"a\", " GROUPS_OK ", \"Subnet\": \"10.0.0.0\"}", "Subnet");
    expect_refused("host bits", "{\"ClusterName\": \"a\", " GROUPS_OK ", \"Subnet\": \"10.0.0.5/24\"}", "host bits");
    expect_refused("small subnet",
                   "{\"ClusterName\": \"a\", \"InstanceGroups\": [{\"InstanceGroupName\": \"c\", \"Role\": "
                   "\"controller\", \"InstanceCount\": 1}, {\"InstanceGroupName\": \"w\", \"Role\": \"worker\", "
                   "\"InstanceCount\": 6}], \"Subnet\": \"10.0.0.0/29\"}",
                   "has room for 5 hosts, the spec has 7 nodes");
    expect_refused("state under /tmp", "{\"ClusterName\": \"a\", " GROUPS_OK ", \"StateDir\": \"/tmp/x\"}",
                   "StateDir: /tmp/x is under /tmp");
    expect_refused("relative shared dir becomes absolute, /dev/shm refused",
                   "{\"ClusterName\": \"a\", " GROUPS_OK ", \"SharedDir\": \"/dev/shm/fsx\"}", "under /dev/shm");
    expect_refused("health check key", "{\"ClusterName\": \"a\", " GROUPS_OK ", \"HealthCheck\": {\"chekcs\": []}}",
                   "HealthCheck: unknown key 'chekcs'");
    expect_refused("health check mpi", "{\"ClusterName\": \"a\", " GROUPS_OK ", \"HealthCheck\": {\"checks\": [\"mpi\"]}}",
                   "the mpi check needs a job's ranks");
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void test_hosts(void) {
    keel_cluster_spec s;
    const char *err;
    keel_status st = parse("{\"ClusterName\": \"prod\", " GROUPS_OK "}", &s, &err);
    EXPECT(st == KEEL_OK, "a spec with GPU workers parses (%s)", err);
    if (st != KEEL_OK) return;
    char hosts[400];
    snprintf(hosts, sizeof hosts, "%s/hosts", dir);
    write_text(hosts, "# name address group\nhead 192.168.1.10 ctl\ngpu-a 192.168.1.21 gpu\ngpu-b 192.168.1.22 gpu  # rack 2\n");
    capture_begin();
    st = keel_cluster_hosts_load(&s, hosts);
    err = capture_end();
    EXPECT(st == KEEL_OK && !strcmp(s.nodes[0].name, "head") && !strcmp(s.nodes[2].addr, "192.168.1.22"),
           "the hosts file names the nodes (%s)", err);
    keel_cluster_files f = {.local = false, .conf_dir = "/etc/slurm", .keel = "/usr/local/bin/keel",
                            .plugin = "/usr/local/lib/keel/keel_auto_resume.so"};
    char out[400];
    snprintf(out, sizeof out, "%s/conf", dir);
    st = keel_cluster_write_files(&s, &f, out, false);
    char p[500], *text = NULL;
    snprintf(p, sizeof p, "%s/slurm.conf", out);
    keel_read_file(p, &text, NULL);
    EXPECT(st == KEEL_OK && text && strstr(text, "SlurmctldHost=head(192.168.1.10)") &&
               strstr(text, "ProctrackType=proctrack/cgroup") && strstr(text, "GresTypes=gpu") &&
               strstr(text, "NodeName=gpu-a NodeAddr=192.168.1.21 NodeHostname=gpu-a CPUs=96 RealMemory=2000 Gres=gpu:8") &&
               strstr(text, "Epilog=/etc/slurm/keel-health.sh") && !strstr(text, "AuthInfo="),
           "real hosts' slurm.conf: cgroups, GPUs as gres, the epilog in --conf-dir, munge's default socket");
    keel_free(text);
    snprintf(p, sizeof p, "%s/plugstack.conf", out);
    keel_read_file(p, &text, NULL);
    EXPECT(text && !strcmp(text, "required /usr/local/lib/keel/keel_auto_resume.so health=/etc/slurm/keel-health.sh "
                                 "health_timeout=120\n"),
           "plugstack.conf loads the plugin with the health program: %s", text ? text : "(none)");
    keel_free(text);
    snprintf(p, sizeof p, "%s/keel-health.sh", out);
    keel_read_file(p, &text, NULL);
    EXPECT(text && strstr(text, "exec \"/usr/local/bin/keel\" health --epilog --node-config \"/etc/slurm/keel-node.json\""),
           "keel-health.sh runs keel health --epilog with the node config");
    keel_free(text);
    snprintf(p, sizeof p, "%s/gres.conf", out);
    EXPECT(keel_path_exists(p), "gres.conf written for GPU workers");
    capture_begin();
    st = keel_cluster_write_files(&s, &f, out, false);
    err = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && strstr(err, "never overwrites"), "a second write is refused: %s", err);

    const char *bad[][2] = {
        {"head 10.0.0.1 ctl\ngpu-a 10.0.0.2 gpu\n", "group gpu has 1 hosts, its InstanceCount is 2"},
        {"head 10.0.0.1 ctl\ngpu-a 10.0.0.2 gpu\ngpu-b 10.0.0.3 gpu\nx 10.0.0.4 gpu\n", "more hosts for group gpu"},
        {"head 10.0.0.1 cpu\n", "no instance group 'cpu'"},
        {"head 10.0.0.1 ctl\ngpu-a 10.0.0.1 gpu\ngpu-b 10.0.0.3 gpu\n", "appears twice"},
        {"head 10.0.0.1\n", "three fields"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(hosts, bad[i][0]);
        capture_begin();
        st = keel_cluster_hosts_load(&s, hosts);
        err = capture_end();
        EXPECT(st == KEEL_ERR_INPUT && strstr(err, bad[i][1]) && strstr(err, hosts), "hosts refused: %s", err);
    }
    keel_cluster_spec_free(&s);
}

int main(void) {
    if (!temp_dir_create(dir, sizeof dir, "cluster_spec")) return 1;
    snprintf(spec_path, sizeof spec_path, "%s/spec.json", dir);
    test_example();
    test_refusals();
    test_hosts();
    remove_tree(dir);
    return test_summary("test_cluster_spec");
}
