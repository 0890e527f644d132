/* Cluster specs (keel/cluster.h): the example parses into the nodes, roles
 * and addresses it describes; every bad spec is refused with one line that
 * names the key; a hosts file maps real hosts onto the groups; slurm.conf
 * for this machine's cluster and for real hosts says what each needs. A spec
 * is data, never code: hostile names and paths ($(...), backticks, quotes,
 * ';', spaces, newlines, '..', relative paths, odd UTF-8, very long values,
 * \u0000, a NUL byte) are refused with the value shown escaped and nothing
 * written; the one shell quoting round-trips any text through sh; `env`'s
 * text sets exactly its variables in bash; random damage to a spec never
 * crashes the parser nor lets a bad path through. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "keel/cluster.h"

#include "../testlib.h"

static char dir[256], spec_path[300];

/* Parse text as the spec file in dir; the error line when it fails. */
static keel_status parse(const char *text, keel_cluster_spec *s, const char **err) {
    capture_begin();
    keel_status st = keel_cluster_spec_parse(text, strlen(text), spec_path, dir, s);
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
    EXPECT(text && strstr(text, "exec '/usr/local/bin/keel' health --epilog --node-config '/etc/slurm/keel-node.json'"),
           "keel-health.sh runs keel health --epilog with the node config (paths single-quoted)");
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

/* Refused like expect_refused, and the line shows no raw control character or byte >= 0x7f. */
static void expect_hostile(const char *name, const char *text, size_t len, const char *want) {
    keel_cluster_spec s;
    capture_begin();
    keel_status st = keel_cluster_spec_parse(text, len, spec_path, dir, &s);
    const char *err = capture_end();
    bool clean = true;
    for (const unsigned char *c = (const unsigned char *)err; *c; c++)
        clean &= (*c >= 0x20 && *c < 0x7f) || (*c == '\n' && !c[1]);
    EXPECT(st == KEEL_ERR_INPUT && count_lines(err) == 1 && clean && strstr(err, want) && strstr(err, spec_path),
           "%s: refused in one clean line naming the file and '%s' (got: %.*s)", name, want,
           (int)strcspn(err, "\n"), err);
    if (st == KEEL_OK) keel_cluster_spec_free(&s);
}

#define SPEC_WITH(extra) "{\"ClusterName\": \"a\", " GROUPS_OK ", " extra "}"
#define LC_GROUPS(src, oc)                                                                                         \
    "{\"ClusterName\": \"a\", \"InstanceGroups\": [{\"InstanceGroupName\": \"c\", \"Role\": \"controller\", "      \
    "\"InstanceCount\": 1, \"LifeCycleConfig\": {\"SourceDir\": \"" src "\", \"OnCreate\": \"" oc "\"}}, "          \
    "{\"InstanceGroupName\": \"w\", \"Role\": \"worker\", \"InstanceCount\": 1}]}"

static void test_hostile(void) {
    static const struct {
        const char *name, *text, *want;
    } cases[] = {
        {"$(...) in StateDir", SPEC_WITH("\"StateDir\": \"/var/lib/$(touch /tmp/keel-pwned)\""),
         "StateDir: '/var/lib/$(touch /tmp/keel-pwned)' has '$' at byte 9"},
        {"backticks in SharedDir", SPEC_WITH("\"SharedDir\": \"/var/lib/`id`\""), "SharedDir: '/var/lib/`id`' has '`'"},
        {"a quote in StateDir", SPEC_WITH("\"StateDir\": \"/var/lib/it's\""), "has ''' at byte 11"},
        {"double quotes in StateDir", SPEC_WITH("\"StateDir\": \"/var/lib/\\\"x\\\"\""), "has '\"' at byte 9"},
        {"';' in StateDir", SPEC_WITH("\"StateDir\": \"/var/lib/a;rm -rf /\""), "has ';' at byte 10"},
        {"a space in SharedDir", SPEC_WITH("\"SharedDir\": \"/srv/my data\""), "has ' ' at byte 7"},
        {"a newline in StateDir", SPEC_WITH("\"StateDir\": \"/var/lib/a\\nb\""), "'/var/lib/a\\nb' has '\\n'"},
        {"a newline in AutoResumePlugin (a second plugstack.conf line)",
         SPEC_WITH("\"AutoResumePlugin\": \"/opt/k.so\\nrequired\\t/tmp/evil.so\""),
         "AutoResumePlugin: '/opt/k.so\\nrequired\\t/tmp/evil.so' has '\\n' at byte 9"},
        {"a space and a second plugin in AutoResumePlugin",
         SPEC_WITH("\"AutoResumePlugin\": \"/opt/k.so health=/x\""), "AutoResumePlugin: '/opt/k.so health=/x' has ' '"},
        {"an escape character in ClusterName", "{\"ClusterName\": \"a\\u001b[31m\", " GROUPS_OK "}",
         "ClusterName: 'a\\x1b[31m' is not a name"},
        {"a long StateDir (the munge socket)",
         SPEC_WITH("\"StateDir\": \"/var/lib/keel/cluster/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\""),
         "more than the 80 this key allows"},
        {"'..' out of /var into /tmp", SPEC_WITH("\"StateDir\": \"/var/../tmp/keel\""), "has a '..' component"},
        {"'..' at the end", SPEC_WITH("\"SharedDir\": \"/var/lib/keel/..\""), "SharedDir: '/var/lib/keel/..'"},
        {"the root as StateDir", SPEC_WITH("\"StateDir\": \"/\""), "StateDir: '/' is the root directory"},
        {"the root as SharedDir", SPEC_WITH("\"SharedDir\": \"//./\""), "is the root directory"},
        {"relative StateDir lands in the spec's /tmp directory", SPEC_WITH("\"StateDir\": \"state\""),
         "is under /tmp"},
        {"odd UTF-8 in StateDir (raw bytes)", SPEC_WITH("\"StateDir\": \"/var/lib/caf\xc3\xa9\""),
         "'/var/lib/caf\\xc3\\xa9' has '\\xc3' at byte 12"},
        {"a right-to-left override", SPEC_WITH("\"SharedDir\": \"/srv/\\u202egpj.sh\""), "has '\\xe2' at byte 5"},
        {"an overlong '/' (C0 AF)", SPEC_WITH("\"StateDir\": \"/var\xc0\xaflib\""), "has '\\xc0' at byte 4"},
        {"\\u0000 cutting a value short", SPEC_WITH("\"StateDir\": \"/var/lib/keel\\u0000/../../etc\""),
         "a string holds \\u0000"},
        {"a key twice", SPEC_WITH("\"StateDir\": \"/var/lib/a\", \"StateDir\": \"/etc\""),
         "key 'StateDir' appears twice"},
        {"text after the object", "{\"ClusterName\": \"a\", " GROUPS_OK "} $(reboot)", "text after the JSON object"},
        {"';' in Partition", SPEC_WITH("\"Partition\": \"dev;id\""), "Partition: 'dev;id' is not a name"},
        {"a space in InstanceGroupName",
         "{\"ClusterName\": \"a\", \"InstanceGroups\": [{\"InstanceGroupName\": \"w x\", \"Role\": \"worker\", "
         "\"InstanceCount\": 1}]}",
         "InstanceGroupName: 'w x' is not a name"},
        {"an unknown key with a newline", SPEC_WITH("\"Colour\\n\": 1"), "unknown key 'Colour\\n'"},
        {"a subnet longer than any", SPEC_WITH("\"Subnet\": \"10.213.0.0/0000000000000000000000024\""),
         "Subnet: '10.213.0.0/0000000000000000000000024' is not an IPv4 subnet"},
        {"InstanceCount far out of int's range",
         "{\"ClusterName\": \"a\", \"InstanceGroups\": [{\"InstanceGroupName\": \"w\", \"Role\": \"worker\", "
         "\"InstanceCount\": 1e300}]}",
         "InstanceCount: want a whole number"},
        {"$(...) in HealthCheck.dir", SPEC_WITH("\"HealthCheck\": {\"checks\": [\"checkpoint_dir\"], \"dir\": \"/x/$(id)\"}"),
         "HealthCheck.dir: '/x/$(id)' has '$'"},
        {"a relative HealthCheck.dir", SPEC_WITH("\"HealthCheck\": {\"dir\": \"scratch\"}"),
         "HealthCheck.dir: 'scratch' is relative"},
        {"a newline in a HealthCheck key", SPEC_WITH("\"HealthCheck\": {\"ch\\necks\": []}"),
         "HealthCheck: key 'ch\\necks'"},
        {"a shell word as a check", SPEC_WITH("\"HealthCheck\": {\"checks\": [\"gemm;id\"]}"),
         "HealthCheck.checks: 'gemm;id' is not a check name"},
        {"OnCreate out of SourceDir by '..'", LC_GROUPS("lc", "../../etc/passwd"), "OnCreate: '../../etc/passwd' has a '..'"},
        {"OnCreate out of SourceDir by an absolute path", LC_GROUPS("lc", "/etc/passwd"), "is not a file in SourceDir"},
        {"SourceDir with a space", LC_GROUPS("my scripts", "on_create.sh"), "SourceDir: 'my scripts' has ' '"},
        {"SourceDir holding StateDir",
         "{\"ClusterName\": \"a\", \"StateDir\": \"/var/lib/keel/a\", \"InstanceGroups\": [{\"InstanceGroupName\": "
         "\"c\", \"Role\": \"controller\", \"InstanceCount\": 1, \"LifeCycleConfig\": {\"SourceDir\": \"/var/lib\", "
         "\"OnCreate\": \"x.sh\"}}, {\"InstanceGroupName\": \"w\", \"Role\": \"worker\", \"InstanceCount\": 1}]}",
         "holds StateDir /var/lib/keel/a"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_hostile(cases[i].name, cases[i].text, strlen(cases[i].text), cases[i].want);

    /* a very long value: refused, shown cut with its length */
    keel_strbuf b = {0};
    keel_strbuf_printf(&b, "{\"ClusterName\": \"a\", " GROUPS_OK ", \"SharedDir\": \"/");
    for (int k = 0; k < 5000; k++) keel_strbuf_printf(&b, "%c", 'a' + k % 26);
    keel_strbuf_printf(&b, "\"}");
    expect_hostile("a 5001-byte SharedDir", b.s, b.n, "... (5001 bytes)' is 5001 bytes long, and a path here has at most 1024");
    keel_free(b.s);
    /* a NUL byte inside the buffer (what a fuzzer hands over) */
    static const char nul[] = "{\"ClusterName\": \"a\"\0, \"StateDir\": \"/etc\"}";
    expect_hostile("a NUL byte", nul, sizeof nul - 1, "a NUL byte at offset 19");
    /* no spec directory: a relative path has nothing to be relative to */
    keel_cluster_spec s;
    const char *text = SPEC_WITH("\"SharedDir\": \"fsx\"");
    capture_begin();
    keel_status st = keel_cluster_spec_parse(text, strlen(text), spec_path, NULL, &s);
    const char *err = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && strstr(err, "SharedDir: 'fsx' is relative"), "without a base: %s", err);
    /* '.' and '//' are dropped, not refused */
    text = SPEC_WITH("\"StateDir\": \"/var/lib//keel/./x/\", \"SharedDir\": \"/srv/fsx-1_a.b\"");
    st = parse(text, &s, &err);
    EXPECT(st == KEEL_OK && !strcmp(s.state_dir, "/var/lib/keel/x") && !strcmp(s.shared_dir, "/srv/fsx-1_a.b"),
           "paths normalised: %s, %s (%s)", st == KEEL_OK ? s.state_dir : "-", st == KEEL_OK ? s.shared_dir : "-", err);
    if (st == KEEL_OK) keel_cluster_spec_free(&s);
}

/* The lifecycle checks that need the disk: keel_cluster_spec_load. */
static void test_load_files(void) {
    char p[400];
    snprintf(p, sizeof p, "%s/lc-spec.json", dir);
    write_text(p, "{\"ClusterName\": \"a\", \"InstanceGroups\": [{\"InstanceGroupName\": \"c\", \"Role\": "
                  "\"controller\", \"InstanceCount\": 1, \"LifeCycleConfig\": {\"OnCreate\": \"nope.sh\"}}, "
                  "{\"InstanceGroupName\": \"w\", \"Role\": \"worker\", \"InstanceCount\": 1}]}");
    keel_cluster_spec s;
    capture_begin();
    keel_status st = keel_cluster_spec_load(p, &s);
    const char *err = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && count_lines(err) == 1 && strstr(err, "OnCreate: ") && strstr(err, p),
           "missing lifecycle script: refused in one line naming the file and 'OnCreate: ' (got: %s)", err);
    /* the same text parsed without the disk: fine (the fuzz entry looks at no file) */
    char *text = NULL;
    keel_read_file(p, &text, NULL);
    capture_begin();
    st = keel_cluster_spec_parse(text, strlen(text), p, dir, &s);
    err = capture_end();
    EXPECT(st == KEEL_OK && s.groups[0].on_create && strstr(s.groups[0].on_create, "/nope.sh"),
           "keel_cluster_spec_parse looks at no file: OnCreate %s (%s)", st == KEEL_OK ? s.groups[0].on_create : "-",
           err);
    /* a FIFO nobody writes to, or a directory, as the spec or the hosts file: refused at once */
    char fifo[400];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    EXPECT(mkfifo(fifo, 0600) == 0, "mkfifo %s", fifo);
    const char *not_files[] = {fifo, dir};
    for (int i = 0; i < 2; i++) {
        keel_cluster_spec none;
        capture_begin();
        keel_status got = keel_cluster_spec_load(not_files[i], &none);
        err = capture_end();
        EXPECT(got == KEEL_ERR_INPUT && count_lines(err) == 1 && strstr(err, not_files[i]) &&
                   strstr(err, "cannot read the spec"),
               "a spec that is no regular file: one line, no wait (%s)", err);
    }
    if (st == KEEL_OK) {
        capture_begin();
        keel_status got = keel_cluster_hosts_load(&s, fifo);
        err = capture_end();
        EXPECT(got == KEEL_ERR_INPUT && count_lines(err) == 1 && strstr(err, "FIFO") && strstr(err, "hosts file"),
               "a hosts file that is a FIFO: one line, no wait (%s)", err);
        keel_cluster_spec_free(&s);
    }
    unlink(fifo);
    keel_free(text);
}

/* Run `printf %s QUOTED` through sh; its output. */
static char *through_sh(const char *quoted) {
    keel_strbuf cmd = {0};
    keel_strbuf_printf(&cmd, "printf %%s %s", quoted);
    FILE *f = popen(cmd.s, "r");
    keel_free(cmd.s);
    keel_strbuf out = {0};
    keel_strbuf_printf(&out, "%s", "");
    char chunk[256];
    size_t got;
    while (f && (got = fread(chunk, 1, sizeof chunk, f)) > 0) keel_strbuf_printf(&out, "%.*s", (int)got, chunk);
    if (f) pclose(f);
    return out.s;
}

static void test_sh_quote(void) {
    char marker[400];
    snprintf(marker, sizeof marker, "%s/quoted-ran", dir);
    char run_it[900];
    snprintf(run_it, sizeof run_it, "$(touch %s)`touch %s`", marker, marker);
    const char *values[] = {"plain", "it's", "''", "'", "a\"b\"", "; touch x; ", "\\", "\\'", "$HOME", "*", "~",
                            "a b  c", "caf\xc3\xa9", "-n", "", "!!", run_it};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        keel_strbuf b = {0};
        bool ok = keel_cluster_sh_quote(&b, values[i]);
        char *back = ok ? through_sh(b.s) : NULL;
        EXPECT(ok && back && !strcmp(back, values[i]), "sh_quote(%s) = %s, read back by sh as itself",
               keel_cluster_show(values[i], 60).s, ok ? b.s : "(refused)");
        keel_free(back);
        keel_free(b.s);
    }
    EXPECT(!keel_path_exists(marker), "nothing quoted ran ($(...) and backticks stayed text)");
    const char *control[] = {"a\nb", "a\rb", "\x1b[2J", "tab\there", "del\x7f"};
    for (size_t i = 0; i < sizeof control / sizeof control[0]; i++) {
        keel_strbuf b = {0};
        EXPECT(!keel_cluster_sh_quote(&b, control[i]) && !b.s, "sh_quote refuses a control character: %s",
               keel_cluster_show(control[i], 60).s);
    }
}

/* `keel cluster env`'s text, sourced by bash in an empty environment, sets exactly its three variables. */
static void test_env_text(void) {
    keel_cluster_spec s;
    const char *err;
    keel_status st = parse(SPEC_WITH("\"StateDir\": \"/var/lib/keel-x/a.b_c\", \"SharedDir\": \"/srv/fsx\""), &s, &err);
    EXPECT(st == KEEL_OK, "a valid spec (%s)", err);
    if (st != KEEL_OK) return;
    char *text = keel_cluster_env_text(&s);
    EXPECT(text && !strcmp(text, "export SLURM_CONF='/var/lib/keel-x/a.b_c/slurm.conf'\n"
                                 "export KEEL_CLUSTER_SHARED='/srv/fsx'\n"
                                 "export KEEL_CLUSTER_KEEL='/var/lib/keel-x/a.b_c/bin/keel'\n"),
           "env: three single-quoted exports: %s", text ? text : "(none)");
    char file[400], cmd[1000];
    snprintf(file, sizeof file, "%s/env.sh", dir);
    write_text(file, text ? text : "");
    snprintf(cmd, sizeof cmd, "env -i /bin/bash --norc --noprofile -c 'eval \"$(cat %s)\"; env' | "
                              "grep -v -e '^PWD=' -e '^SHLVL=' -e '^_=' | sort", file);
    FILE *f = popen(cmd, "r");
    char got[2000] = "";
    size_t n = f ? fread(got, 1, sizeof got - 1, f) : 0;
    got[n] = 0;
    if (f) pclose(f);
    EXPECT(!strcmp(got, "KEEL_CLUSTER_KEEL=/var/lib/keel-x/a.b_c/bin/keel\nKEEL_CLUSTER_SHARED=/srv/fsx\n"
                        "SLURM_CONF=/var/lib/keel-x/a.b_c/slurm.conf\n"),
           "bash, after eval, has exactly SLURM_CONF, KEEL_CLUSTER_SHARED, KEEL_CLUSTER_KEEL: %s", got);
    keel_free(text);
    keel_cluster_spec_free(&s);
}

/* What goes into Slurm's files: paths for real hosts every host has, the spec's path a one-line comment. */
static void test_files_refuse(void) {
    keel_cluster_spec s;
    const char *err;
    char odd_path[] = "/x/spec\nNodeName=evil.json";
    capture_begin();
    const char *text = "{\"ClusterName\": \"a\", " GROUPS_OK "}";
    keel_status st = keel_cluster_spec_parse(text, strlen(text), odd_path, dir, &s);
    err = capture_end();
    EXPECT(st == KEEL_OK, "parsed (%s)", err);
    if (st != KEEL_OK) return;
    keel_cluster_files f = {.local = false, .conf_dir = "/etc/slurm", .keel = "/usr/local/bin/keel",
                            .plugin = "/usr/local/lib/keel/keel_auto_resume.so"};
    char *conf = keel_cluster_slurm_conf(&s, &f);
    EXPECT(conf && !strstr(conf, "\nNodeName=evil") && strstr(conf, "from /x/spec\\nNodeName=evil.json\n"),
           "the spec's path is one escaped comment line in slurm.conf");
    keel_free(conf);
    static const struct {
        const char *conf_dir, *keel, *plugin, *want;
    } bad[] = {
        {"/etc/slurm", "/tmp/keel-clone/build/keel", "/usr/local/lib/keel/keel_auto_resume.so",
         "--keel /tmp/keel-clone/build/keel is under /tmp, which every host has its own of"},
        {"/etc/slurm", "/usr/local/bin/keel", "/dev/shm/k.so", "AutoResumePlugin /dev/shm/k.so is under /dev/shm"},
        {"/etc/slurm\nx", "/usr/local/bin/keel", "/usr/local/lib/keel/keel_auto_resume.so",
         "--conf-dir '/etc/slurm\\nx' has '\\n'"},
        {"etc/slurm", "/usr/local/bin/keel", "/usr/local/lib/keel/keel_auto_resume.so",
         "--conf-dir 'etc/slurm' is relative"},
        {"/etc/slurm", "/usr/local/bin/keel\"; reboot; \"", "/usr/local/lib/keel/keel_auto_resume.so",
         "--keel '/usr/local/bin/keel\"; reboot; \"' has '\"'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char out[400];
        snprintf(out, sizeof out, "%s/refused-%zu", dir, i);
        keel_cluster_files g = {.local = false, .conf_dir = bad[i].conf_dir, .keel = bad[i].keel,
                                .plugin = bad[i].plugin};
        capture_begin();
        st = keel_cluster_write_files(&s, &g, out, false);
        err = capture_end();
        EXPECT(st == KEEL_ERR_INPUT && count_lines(err) == 1 && strstr(err, bad[i].want) && !keel_path_exists(out),
               "slurm-conf refuses %s, writing nothing: %s", bad[i].want, err);
    }
    keel_cluster_spec_free(&s);
}

/* Every component of an absolute path is a name: none empty, ".", "..". */
static bool components_clean(const char *p) {
    for (const char *c = p; *c == '/';) {
        size_t len = strcspn(c + 1, "/");
        if (len == 0 || (len == 1 && c[1] == '.') || (len == 2 && c[1] == '.' && c[2] == '.')) return false;
        c += 1 + len;
    }
    return true;
}

/* Damage the example spec at random (bytes flipped, hostile text spliced
 * in): the parser never crashes (ASan watches), and whatever it accepts
 * holds to the grammar and quotes into an env text. */
static void test_damaged_specs(void) {
    char path[600], *good = NULL;
    snprintf(path, sizeof path, "%s/examples/cluster-local.json", getenv("KEEL_SRC") ? getenv("KEEL_SRC") : ".");
    if (keel_read_file(path, &good, NULL) != KEEL_OK) return;
    size_t n = strlen(good);
    static const char *const splice[] = {"$(", "`", "'", "\"", "\\n", "\\u0000", "..", "/", " ", ";", "\xc3", "\\",
                                         "{", "}", "[", "]", ",", ":", "1e999", "-1", "\\u00e9", "//", "/."};
    unsigned seed = 12345;
    int accepted = 0, broken = 0;
    char *buf = keel_xmalloc(n + 64, "damaged spec");
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(buf, good, n + 1);
        size_t len = n;
        for (int k = 0; k < 1 + iter % 3; k++) {
            seed = seed * 1103515245u + 12345u;
            size_t at = (seed >> 8) % len;
            seed = seed * 1103515245u + 12345u;
            if (seed % 3 == 0) {
                buf[at] = (char)(seed >> 16);
            } else {
                const char *t = splice[(seed >> 12) % (sizeof splice / sizeof splice[0])];
                size_t tn = strlen(t);
                if (len + tn >= n + 60) continue;
                memmove(buf + at + tn, buf + at, len - at + 1);
                memcpy(buf + at, t, tn);
                len += tn;
            }
        }
        keel_cluster_spec s;
        capture_begin();
        keel_status st = keel_cluster_spec_parse(buf, len, path, "/srv/specs", &s);
        const char *err = capture_end();
        if (st != KEEL_OK) {
            if (count_lines(err) != 1) {
                broken++;
                printf("broken refusal of [%.*s]: %s\n", (int)len, buf, err);
            }
            continue;
        }
        accepted++;
        const char *paths[] = {s.state_dir, s.shared_dir, s.plugin ? s.plugin : "/x"};
        for (int p = 0; p < 3; p++) {
            bool ok = paths[p][0] == '/' && components_clean(paths[p]) &&
                      strspn(paths[p], "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/") ==
                          strlen(paths[p]);
            if (!ok) printf("accepted a bad path %s from [%.*s]\n", paths[p], (int)len, buf);
            broken += !ok;
        }
        char *env = keel_cluster_env_text(&s);
        broken += !env;
        keel_free(env);
        keel_cluster_spec_free(&s);
    }
    keel_free(buf);
    keel_free(good);
    EXPECT(broken == 0 && accepted > 0, "3000 damaged specs: %d accepted, all clean paths; every refusal one line "
                                        "(%d broken)", accepted, broken);
}

int main(void) {
    if (!temp_dir_create(dir, sizeof dir, "cluster_spec")) return 1;
    snprintf(spec_path, sizeof spec_path, "%s/spec.json", dir);
    test_example();
    test_refusals();
    test_hosts();
    test_hostile();
    test_load_files();
    test_sh_quote();
    test_env_text();
    test_files_refuse();
    test_damaged_specs();
    remove_tree(dir);
    return test_summary("test_cluster_spec");
}
