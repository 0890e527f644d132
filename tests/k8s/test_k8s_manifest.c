/* `keel k8s manifest` specs and their YAML (keel/k8s.h): the examples parse
 * into the jobs they describe and render the fields the operators read (a
 * PyTorchJob's elasticPolicy on etcd, nprocPerNode, GPUs, EFA, /dev/shm, the
 * checkpoint claim, `keel agent`; the etcd Deployment and Service; an
 * MPIJob's launcher running `keel train --nproc N` with no OpenMPI setting
 * that pins it to loopback); every bad spec is refused in one line naming
 * the file and the key; a hostile value stays one quoted scalar; --out
 * writes the files and never overwrites unless asked. A .env file of the AWS
 * guide's variables renders what the JSON spec of the same values renders,
 * and each bad line is refused naming the file, the line and the variable.
 * (tests/k8s/k8s_manifest_schema.sh checks the same YAML against the CRDs'
 * schemas.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "keel/k8s.h"

#include "../testlib.h"

static char dir[256];

static keel_status parse(const char *text, keel_k8s_spec *s, const char **err) {
    capture_begin();
    keel_status st = keel_k8s_spec_parse(text, strlen(text), "spec.json", "20260101-000000", s);
    *err = capture_end();
    return st;
}

static void expect_refused(const char *name, const char *text, const char *want) {
    keel_k8s_spec s;
    const char *err;
    keel_status st = parse(text, &s, &err);
    EXPECT(st == KEEL_ERR_INPUT && count_lines(err) == 1 && strstr(err, want) && strstr(err, "spec.json"),
           "%s: refused in one line naming the file and '%s' (got: %.*s)", name, want, (int)strcspn(err, "\n"), err);
    if (st == KEEL_OK) keel_k8s_spec_free(&s);
}

#define BASE "\"name\": \"job\", \"image\": \"keel:1\", \"checkpointClaim\": \"ckpt\""

static char *render_text(const char *text) {
    keel_k8s_spec s;
    const char *err;
    if (parse(text, &s, &err) != KEEL_OK) {
        EXPECT(false, "spec parses: %s (%s)", text, err);
        return NULL;
    }
    char *yaml = keel_k8s_render(&s);
    keel_k8s_spec_free(&s);
    return yaml;
}

static bool has(const char *yaml, const char *want) { return yaml && strstr(yaml, want); }

static void test_example_elastic(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/examples/k8s-pytorchjob.json", getenv("KEEL_SRC") ? getenv("KEEL_SRC") : ".");
    keel_k8s_spec s;
    keel_status st = keel_k8s_spec_load(path, &s);
    EXPECT(st == KEEL_OK, "examples/k8s-pytorchjob.json parses");
    if (st != KEEL_OK) return;
    EXPECT(s.kind == KEEL_K8S_PYTORCHJOB && s.elastic && !s.master && s.nodes == 4 && s.min_nodes == 2 &&
               s.max_nodes == 4 && s.nproc_per_node == 8 && s.gpus_per_node == 8 && s.efa_per_node == 4,
           "an elastic PyTorchJob of 2..4 nodes, 4 to start, 8 GPUs and 4 EFA each, no Master");
    EXPECT(!strncmp(s.run_id, "llama-fsdp-", 11) && strlen(s.run_id) == strlen("llama-fsdp-20260101-000000"),
           "the default run id is the name and the time of rendering: %s", s.run_id);
    char *yaml = keel_k8s_render(&s);
    EXPECT(has(yaml, "apiVersion: \"apps/v1\"\nkind: \"Deployment\"") && has(yaml, "apiVersion: \"v1\"\nkind: \"Service\""),
           "an etcd Deployment and Service");
    EXPECT(has(yaml, "apiVersion: \"kubeflow.org/v1\"\nkind: \"PyTorchJob\"") && has(yaml, "  nprocPerNode: \"8\"\n"),
           "a kubeflow.org/v1 PyTorchJob with nprocPerNode as a string");
    EXPECT(has(yaml, "    minReplicas: 2\n    maxReplicas: 4\n    rdzvBackend: \"etcd\"\n"
                     "    rdzvHost: \"llama-fsdp-etcd\"\n    rdzvPort: 2379\n"),
           "elasticPolicy: 2..4 replicas meeting in the etcd Service");
    EXPECT(has(yaml, "    maxRestarts: 3\n") && !has(yaml, "Master:") && has(yaml, "    Worker:\n      replicas: 4\n"),
           "Workers only, 4 of them, maxRestarts 3");
    EXPECT(has(yaml, "- name: \"pytorch\"") &&
               has(yaml, "- \"keel\"\n            - \"agent\"\n            - \"/fsx/configs/llama-7b.json\"\n"
                         "            - \"--run-dir\"\n            - \"/fsx/runs/llama-fsdp\"\n"),
           "container pytorch runs keel agent CONFIG --run-dir on the checkpoint volume");
    EXPECT(has(yaml, "nvidia.com/gpu: \"8\"") && has(yaml, "vpc.amazonaws.com/efa: \"4\""), "GPUs and EFA");
    EXPECT(has(yaml, "medium: \"Memory\"") && has(yaml, "sizeLimit: \"64Gi\"") &&
               has(yaml, "mountPath: \"/dev/shm\"") && has(yaml, "claimName: \"fsx-claim\"") &&
               has(yaml, "mountPath: \"/fsx\""),
           "/dev/shm memory-backed at 64Gi; the checkpoint claim at /fsx");
    EXPECT(has(yaml, "namespace: \"training\"") && has(yaml, "- \"--advertise-client-urls\"\n") &&
               has(yaml, "- \"http://llama-fsdp-etcd:2379\"\n"),
           "etcd advertises its Service; every object in the namespace");
    EXPECT(!has(yaml, "PET_RDZV_ENDPOINT"), "an elastic job leaves PET_RDZV_* to the operator");
    keel_free(yaml);
    keel_k8s_spec_free(&s);
}

static void test_master_and_workers(void) {
    char *yaml = render_text("{" BASE ", \"nodes\": 3, \"nprocPerNode\": 2, \"runId\": \"job-7\"}");
    EXPECT(has(yaml, "    Master:\n      replicas: 1\n") && has(yaml, "    Worker:\n      replicas: 2\n"),
           "3 nodes: one Master and 2 Workers");
    EXPECT(!has(yaml, "elasticPolicy") && has(yaml, "\"PET_RDZV_BACKEND\"\n") &&
               has(yaml, "value: \"job-etcd:2379\"") && has(yaml, "value: \"job-7\""),
           "a fixed job: the agents' rendezvous in env (etcd endpoint, run id)");
    EXPECT(!has(yaml, "nvidia.com/gpu") && !has(yaml, "efa") && has(yaml, "sizeLimit: \"16Gi\"") &&
               has(yaml, "mountPath: \"/checkpoints\"") && has(yaml, "- \"/etc/keel/config.json\"\n"),
           "defaults: no GPU/EFA, 16Gi /dev/shm, /checkpoints, /etc/keel/config.json");
    keel_free(yaml);
    yaml = render_text("{" BASE ", \"nodes\": 1}");
    EXPECT(has(yaml, "Master:") && !has(yaml, "Worker:"), "1 node: a Master alone");
    keel_free(yaml);
    yaml = render_text("{" BASE ", \"nodes\": 2, \"master\": false}");
    EXPECT(!has(yaml, "Master:") && has(yaml, "    Worker:\n      replicas: 2\n"), "master false: Workers only");
    keel_free(yaml);
}

static void test_mpijob(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/examples/k8s-mpijob.json", getenv("KEEL_SRC") ? getenv("KEEL_SRC") : ".");
    keel_k8s_spec s;
    EXPECT(keel_k8s_spec_load(path, &s) == KEEL_OK, "examples/k8s-mpijob.json parses");
    if (!s.path) return;
    keel_k8s_file files[KEEL_K8S_MAX_FILES];
    int n = keel_k8s_render_files(&s, files);
    const char *yaml = files[0].yaml;
    EXPECT(n == 1 && !strcmp(files[0].name, "mpijob.yaml"), "an MPIJob alone: no etcd");
    EXPECT(has(yaml, "apiVersion: \"kubeflow.org/v2beta1\"\nkind: \"MPIJob\"") && has(yaml, "  slotsPerWorker: 8\n") &&
               has(yaml, "    Launcher:\n      replicas: 1\n") && has(yaml, "    Worker:\n      replicas: 2\n"),
           "kubeflow.org/v2beta1 MPIJob: 1 Launcher, 2 Workers of 8 slots");
    EXPECT(has(yaml, "- \"train\"\n") && has(yaml, "- \"--nproc\"\n") && has(yaml, "- \"16\"\n") &&
               has(yaml, "- \"--run-dir\"\n") && has(yaml, "- \"/fsx/runs/llama-mpi\"\n") &&
               has(yaml, "- \"/usr/sbin/sshd\"\n"),
           "the launcher runs keel train --nproc 16 with its run on the shared volume; workers run sshd");
    EXPECT(!has(yaml, "OMPI_MCA") && !has(yaml, "if_include") && !has(yaml, "\"lo\""),
           "nothing pins OpenMPI to loopback");
    for (int i = 0; i < n; i++) keel_free(files[i].yaml);
    keel_k8s_spec_free(&s);
}

static void test_refusals(void) {
    expect_refused("no image", "{\"name\": \"job\", \"nodes\": 2, \"checkpointClaim\": \"c\"}", "image: missing");
    expect_refused("empty image", "{" BASE ", \"nodes\": 2, \"image\": \"\"}", "image");
    expect_refused("gpus != nproc", "{" BASE ", \"nodes\": 2, \"nprocPerNode\": 8, \"gpusPerNode\": 4}",
                   "gpusPerNode: 4 GPUs for nprocPerNode 8");
    expect_refused("min > max", "{" BASE ", \"elastic\": {\"minNodes\": 4, \"maxNodes\": 2}}",
                   "elastic.minNodes: 4 is more than elastic.maxNodes 2");
    expect_refused("elastic with a master", "{" BASE ", \"master\": true, \"elastic\": {\"minNodes\": 1, \"maxNodes\": 2}}",
                   "master: true with elastic");
    expect_refused("nodes outside min..max", "{" BASE ", \"nodes\": 5, \"elastic\": {\"minNodes\": 1, \"maxNodes\": 2}}",
                   "nodes: 5 is outside");
    expect_refused("upper-case name", "{\"name\": \"Job\", \"image\": \"k\", \"nodes\": 1, \"checkpointClaim\": \"c\"}",
                   "name: 'Job' is not a DNS-1035 label");
    expect_refused("name starting with a digit", "{\"name\": \"1job\", \"image\": \"k\", \"nodes\": 1, \"checkpointClaim\": \"c\"}",
                   "DNS-1035");
    expect_refused("name ending in -", "{\"name\": \"job-\", \"image\": \"k\", \"nodes\": 1, \"checkpointClaim\": \"c\"}",
                   "DNS-1035");
    expect_refused("name too long for its pods",
                   "{\"name\": \"a23456789012345678901234567890123456789012345678901234\", \"image\": \"k\", "
                   "\"nodes\": 20, \"checkpointClaim\": \"c\"}",
                   "more than a DNS label's 63");
    expect_refused("bad namespace", "{" BASE ", \"nodes\": 1, \"namespace\": \"a_b\"}", "namespace: 'a_b'");
    expect_refused("bad claim", "{\"name\": \"j\", \"image\": \"k\", \"nodes\": 1, \"checkpointClaim\": \"a..b\"}",
                   "checkpointClaim");
    expect_refused("misspelled key", "{" BASE ", \"nodes\": 1, \"nprocPerNod\": 2}", "nprocPerNod: unknown key");
    expect_refused("misspelled elastic key", "{" BASE ", \"elastic\": {\"minNodes\": 1, \"maxNode\": 2}}",
                   "elastic.maxNode: unknown key");
    expect_refused("repeated key", "{" BASE ", \"nodes\": 1, \"nodes\": 2}", "nodes: appears twice");
    expect_refused("nodes as a string", "{" BASE ", \"nodes\": \"2\"}", "nodes: want a whole number 1..1000, not a string");
    expect_refused("nodes 0", "{" BASE ", \"nodes\": 0}", "nodes: 0 is not a whole number 1..1000");
    expect_refused("nodes 1e300", "{" BASE ", \"nodes\": 1e300}", "nodes");
    expect_refused("fractional nproc", "{" BASE ", \"nodes\": 1, \"nprocPerNode\": 1.5}", "nprocPerNode");
    expect_refused("shm 0", "{" BASE ", \"nodes\": 1, \"shmSizeGiB\": 0}", "shmSizeGiB");
    expect_refused("master a string", "{" BASE ", \"nodes\": 1, \"master\": \"yes\"}", "master: want true or false");
    expect_refused("missing nodes", "{" BASE "}", "nodes: missing");
    expect_refused("missing claim", "{\"name\": \"j\", \"image\": \"k\", \"nodes\": 1}", "checkpointClaim: missing");
    expect_refused("relative config", "{" BASE ", \"nodes\": 1, \"config\": \"config.json\"}", "config: 'config.json'");
    expect_refused("config with ..", "{" BASE ", \"nodes\": 1, \"config\": \"/a/../b\"}", "config");
    expect_refused("checkpoints on /dev/shm", "{" BASE ", \"nodes\": 1, \"checkpointMountPath\": \"/dev/shm/c\"}",
                   "checkpointMountPath");
    expect_refused("unknown kind", "{" BASE ", \"nodes\": 1, \"kind\": \"TFJob\"}", "kind: 'TFJob'");
    expect_refused("elastic MPIJob", "{" BASE ", \"kind\": \"MPIJob\", \"elastic\": {\"minNodes\": 1, \"maxNodes\": 2}}",
                   "elastic: an MPIJob");
    expect_refused("MPIJob with a master", "{" BASE ", \"kind\": \"MPIJob\", \"nodes\": 1, \"master\": true}",
                   "master: an MPIJob");
    expect_refused("MPIJob with a run id", "{" BASE ", \"kind\": \"MPIJob\", \"nodes\": 1, \"runId\": \"r\"}",
                   "runId: an MPIJob");
    expect_refused("bad run id", "{" BASE ", \"nodes\": 1, \"runId\": \"R_1\"}", "runId: 'R_1'");
    expect_refused("not an object", "[1]", "not a JSON object");
    expect_refused("not JSON", "{\"name\": ", "not valid JSON");
    expect_refused("text after", "{" BASE ", \"nodes\": 1} x", "text after the JSON object");
    expect_refused("escaped NUL", "{" BASE ", \"nodes\": 1, \"config\": \"/a\\u0000b\"}", "\\u0000");
}

/* Values that would end a YAML scalar or add keys never get past the grammar; the quoting holds
 * on its own too. */
static void test_hostile(void) {
    expect_refused("image with a newline", "{" BASE ", \"nodes\": 1, \"image\": \"k\\nkind: Secret\"}", "image");
    expect_refused("image with a quote", "{" BASE ", \"nodes\": 1, \"image\": \"k\\\"x\"}", "image");
    expect_refused("image with a space", "{" BASE ", \"nodes\": 1, \"image\": \"k: v\"}", "image");
    expect_refused("config with a #", "{" BASE ", \"nodes\": 1, \"config\": \"/a #b\"}", "config");
    expect_refused("claim with a newline", "{\"name\": \"j\", \"image\": \"k\", \"nodes\": 1, \"checkpointClaim\": \"a\\n---\"}",
                   "checkpointClaim");
    keel_strbuf b = {0};
    keel_k8s_yaml_quote(&b, "a\"b\\c\nd\x01: #e");
    EXPECT(b.s && !strcmp(b.s, "\"a\\\"b\\\\c\\x0ad\\x01: #e\""), "quoting escapes '\"', '\\\\' and control bytes: %s",
           b.s);
    keel_free(b.s);
}

/* ---- the .env form ---------------------------------------------------------------------- */

static keel_status env_parse(const char *text, keel_k8s_spec *s, const char **err) {
    capture_begin();
    keel_status st = keel_k8s_env_parse(text, strlen(text), "job.env", "20260101-000000", s);
    *err = capture_end();
    return st;
}

static void expect_env_refused(const char *name, const char *text, const char *want) {
    keel_k8s_spec s;
    const char *err;
    keel_status st = env_parse(text, &s, &err);
    EXPECT(st == KEEL_ERR_INPUT && count_lines(err) == 1 && strstr(err, want),
           "%s: refused in one line naming '%s' (got: %.*s)", name, want, (int)strcspn(err, "\n"), err);
    if (st == KEEL_OK) keel_k8s_spec_free(&s);
}

#define ENV_BASE "JOB_NAME=job\nIMAGE_URI=keel:1\nCHECKPOINT_CLAIM=ckpt\n"

static void test_env(void) {
    /* the guide's own lines (export, a bare value), a comment, quotes of both kinds, a CRLF line */
    const char *env = "# the guide's env_vars, for keel\n"
                      "export IMAGE_URI=registry.example.com/keel:0.1\n"
                      "export INSTANCE_TYPE_NOTE_IS_A_COMMENT_HERE=x\n";
    keel_k8s_spec s;
    const char *err;
    expect_env_refused("an unknown variable", env, "job.env:3: INSTANCE_TYPE_NOTE_IS_A_COMMENT_HERE: not a variable");
    env = "# the guide's env_vars, for keel\n"
          "export IMAGE_URI=registry.example.com/keel:0.1\n"
          "export NUM_NODES=4   # p5.48xlarge\n"
          "  export GPU_PER_NODE='8'\r\n"
          "EFA_PER_NODE=\"32\"\n"
          "FI_PROVIDER=efa\n"
          "\n"
          "JOB_NAME=llama-fsdp\nNAMESPACE=training\nCHECKPOINT_CLAIM=fsx-claim\nCHECKPOINT_DIR=/fsx\n"
          "KEEL_CONFIG=/fsx/configs/llama-7b.json\nSHM_SIZE_GIB=64\nRUN_ID=llama-fsdp-1\n";
    const char *json = "{\"name\": \"llama-fsdp\", \"namespace\": \"training\", \"image\": "
                       "\"registry.example.com/keel:0.1\", \"nodes\": 4, \"nprocPerNode\": 8, \"gpusPerNode\": 8, "
                       "\"efaPerNode\": 32, \"checkpointClaim\": \"fsx-claim\", \"checkpointMountPath\": \"/fsx\", "
                       "\"config\": \"/fsx/configs/llama-7b.json\", \"shmSizeGiB\": 64, \"runId\": \"llama-fsdp-1\"}";
    keel_status st = env_parse(env, &s, &err);
    EXPECT(st == KEEL_OK, "the guide's variables parse (%s)", err);
    if (st == KEEL_OK) {
        char *from_env = keel_k8s_render(&s), *from_json = render_text(json);
        EXPECT(from_env && from_json && !strcmp(from_env, from_json), "and render what the JSON spec renders");
        keel_free(from_env);
        keel_free(from_json);
        keel_k8s_spec_free(&s);
    }
    st = env_parse(ENV_BASE "MIN_NODES=2\nMAX_NODES=4\nMAX_RESTARTS=5\n", &s, &err);
    EXPECT(st == KEEL_OK && s.elastic && s.min_nodes == 2 && s.max_nodes == 4 && s.max_restarts == 5 &&
               s.nodes == 4 && !s.master,
           "MIN_NODES and MAX_NODES: an elastic job (%s)", err);
    if (st == KEEL_OK) keel_k8s_spec_free(&s);

    expect_env_refused("a command substitution", ENV_BASE "NUM_NODES=$(touch /tmp/keel-env-pwned)\n",
                       "job.env:4: NUM_NODES: '$' in the value");
    expect_env_refused("one in quotes", ENV_BASE "NAMESPACE=\"$(id -u)\"\n", "job.env:4: NAMESPACE: '$'");
    expect_env_refused("a backtick", ENV_BASE "NAMESPACE='`id`'\n", "NAMESPACE: '`'");
    expect_env_refused("a variable", ENV_BASE "ETCD_IMAGE=${REGISTRY}etcd:3\n", "ETCD_IMAGE: '$'");
    expect_env_refused("a backslash", ENV_BASE "NAMESPACE=\"a\\\\b\"\n", "'\\'");
    expect_env_refused("a blank in a bare value", ENV_BASE "NUM_NODES=4 2\n", "job.env:4: NUM_NODES: '2' after the value");
    expect_env_refused("a shell character", ENV_BASE "NAMESPACE=a;b\n", "';' in a bare value; quote");
    expect_env_refused("an open quote", ENV_BASE "NAMESPACE='training\n", "not closed");
    expect_env_refused("blanks around =", ENV_BASE "NUM_NODES = 4\n", "job.env:4: NUM_NODES: want '=' right after");
    expect_env_refused("not NAME=VALUE", ENV_BASE "4=4\n", "job.env:4: '4=4' is not NAME=VALUE");
    expect_env_refused("set twice", ENV_BASE "NUM_NODES=1\nNUM_NODES=2\n", "job.env:5: NUM_NODES: set again (first on line 4)");
    expect_env_refused("INSTANCE_TYPE", ENV_BASE "INSTANCE_TYPE=p5.48xlarge\n", "INSTANCE_TYPE: keel renders no nodeSelector");
    expect_env_refused("HF_TOKEN", ENV_BASE "HF_TOKEN=hf_x\n", "HF_TOKEN: keel's pods read no Hugging Face Hub");
    expect_env_refused("not a number", ENV_BASE "NUM_NODES=four\n", "job.env:4: NUM_NODES: 'four' is not a whole number");
    expect_env_refused("not a flag", ENV_BASE "NUM_NODES=2\nMASTER=yes\n", "MASTER: 'yes' is not true or false");
    expect_env_refused("another libfabric provider", ENV_BASE "NUM_NODES=1\nFI_PROVIDER=tcp\n", "FI_PROVIDER: 'tcp'");
    expect_env_refused("efa without devices", ENV_BASE "NUM_NODES=1\nFI_PROVIDER=efa\n",
                       "job.env:5: FI_PROVIDER: efa without EFA devices");
    /* what spec.c refuses names the variable and its line */
    expect_env_refused("nodes 0", ENV_BASE "NUM_NODES=0\n", "job.env:4: NUM_NODES (nodes): 0 is not a whole number 1..1000");
    expect_env_refused("a bad name", "JOB_NAME=Llama\nIMAGE_URI=k\nNUM_NODES=1\nCHECKPOINT_CLAIM=c\n",
                       "job.env:1: JOB_NAME (name): 'Llama' is not a DNS-1035 label");
    expect_env_refused("a missing claim", "JOB_NAME=j\nIMAGE_URI=k\nNUM_NODES=1\n",
                       "job.env: CHECKPOINT_CLAIM (checkpointClaim): missing");
    expect_env_refused("min > max", ENV_BASE "MIN_NODES=4\nMAX_NODES=2\n",
                       "job.env:4: MIN_NODES (elastic.minNodes): 4 is more than elastic.maxNodes 2");
    expect_env_refused("GPUs beside another nproc", ENV_BASE "NUM_NODES=1\nGPU_PER_NODE=8\nNPROC_PER_NODE=4\n",
                       "job.env:5: GPU_PER_NODE (gpusPerNode): 8 GPUs for nprocPerNode 4");
    capture_begin();
    st = keel_k8s_env_parse("JOB_NAME=a\0b\n", 12, "job.env", NULL, &s);
    err = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && strstr(err, "job.env: a NUL byte at offset 10"), "a NUL byte is refused: %s", err);
}

static void test_write(void) {
    char out[400];
    snprintf(out, sizeof out, "%s/out", dir);
    keel_k8s_spec s;
    const char *err;
    if (parse("{" BASE ", \"nodes\": 2}", &s, &err) != KEEL_OK) {
        EXPECT(false, "spec parses: %s", err);
        return;
    }
    EXPECT(keel_k8s_write(&s, out, false) == KEEL_OK, "--out writes into a new directory");
    char p[600];
    snprintf(p, sizeof p, "%s/etcd.yaml", out);
    EXPECT(keel_path_exists(p), "etcd.yaml written");
    snprintf(p, sizeof p, "%s/pytorchjob.yaml", out);
    EXPECT(keel_path_exists(p), "pytorchjob.yaml written");
    FILE *f = fopen(p, "w");
    if (f) fputs("mine\n", f), fclose(f);
    capture_begin();
    keel_status st = keel_k8s_write(&s, out, false);
    err = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && count_lines(err) == 1 && strstr(err, "exists"), "an existing file is refused: %s",
           err);
    char *text = NULL;
    EXPECT(keel_read_file(p, &text, NULL) == KEEL_OK && text && !strcmp(text, "mine\n"), "and left as it was");
    keel_free(text);
    EXPECT(keel_k8s_write(&s, out, true) == KEEL_OK, "replace: written over");
    text = NULL;
    EXPECT(keel_read_file(p, &text, NULL) == KEEL_OK && text && strstr(text, "kind: \"PyTorchJob\""), "the new text");
    keel_free(text);
    keel_k8s_spec_free(&s);
}

int main(void) {
    if (!temp_dir_create(dir, sizeof dir, "k8s_manifest")) return 1;
    test_example_elastic();
    test_master_and_workers();
    test_mpijob();
    test_refusals();
    test_hostile();
    test_env();
    test_write();
    remove_tree(dir);
    return test_summary("test_k8s_manifest");
}
