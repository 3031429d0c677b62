// Checks duet's Kubernetes manifests (deploy/kubernetes/*.yaml): every
// document against the Kubernetes API's schemas (the kubernetes-models
// package), then what the schemas cannot see: each Deployment's selector
// matches its pod labels, every probe and scrape port is a port its container
// declares, each Service selects exactly one Deployment's pods and targets
// ports they declare, the workers' --router names the router's Service and
// control port, and the grace period outlasts the drain; the planner's
// service account is bound to a Role that lets it get and patch the scale
// of the Deployments it resizes (and those exist), and its --router names
// the router's API. Prints one JSON
// line: {"containers": [{"file", "container", "args"}]}, each container's
// arguments with $(VAR) replaced by a sample value, for the C++ test to hand
// to the real binary's flag parser.
//
//   node k8s_manifests_check.js deploy/kubernetes
'use strict';
const assert = require('assert/strict');
const fs = require('fs');
const path = require('path');
const { requirePackage, usage } = require('./common.js');

const YAML = requirePackage('yaml/dist/index.js');
const models = {
  'apps/v1/Deployment': requirePackage('kubernetes-models/apps/v1/Deployment.js').Deployment,
  'v1/Service': requirePackage('kubernetes-models/v1/Service.js').Service,
  'v1/PersistentVolumeClaim': requirePackage('kubernetes-models/v1/PersistentVolumeClaim.js').PersistentVolumeClaim,
  'v1/ServiceAccount': requirePackage('kubernetes-models/v1/ServiceAccount.js').ServiceAccount,
  'rbac.authorization.k8s.io/v1/Role': requirePackage('kubernetes-models/rbac.authorization.k8s.io/v1/Role.js').Role,
  'rbac.authorization.k8s.io/v1/RoleBinding':
      requirePackage('kubernetes-models/rbac.authorization.k8s.io/v1/RoleBinding.js').RoleBinding,
};
// What the downward API would put in $(VAR).
const samples = { POD_IP: '10.1.2.3', POD_NAME: 'duet-pod-7f9c' };

function validate(doc, where) {
  const Model = models[`${doc.apiVersion}/${doc.kind}`];
  assert.ok(Model, `${where}: ${doc.apiVersion} ${doc.kind} is not a kind this check knows`);
  new Model(doc).validate();  // Throws naming the field.
}

function portOf(container, port, where) {
  const ports = container.ports || [];
  const found = typeof port === 'number' ? ports.find((p) => p.containerPort === port)
                                         : ports.find((p) => p.name === port);
  assert.ok(found, `${where}: port ${port} is not a port of container ${container.name}`);
  return found.containerPort;
}

function subset(a, b) {
  return Object.entries(a || {}).every(([k, v]) => b && b[k] === v);
}

function flagValue(args, flag) {
  const i = args.indexOf(flag);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : undefined;
}

// What `duet planner` needs of the API server: get and patch on the scale
// of each Deployment it resizes, granted to the pod's service account by a
// RoleBinding in the manifests.
function checkPlannerRbac(docs, pod, args, at) {
  const sa = pod.spec.serviceAccountName;
  assert.ok(sa, `${at}: the planner pod names no serviceAccountName`);
  assert.ok(docs.some((d) => d.doc.kind === 'ServiceAccount' && d.doc.metadata.name === sa),
            `${at}: no ServiceAccount ${sa}`);
  const bindings = docs.filter((d) => d.doc.kind === 'RoleBinding' &&
                                      d.doc.subjects.some((s) => s.kind === 'ServiceAccount' && s.name === sa));
  const rules = [];
  for (const b of bindings) {
    const role = docs.find((d) => d.doc.kind === b.doc.roleRef.kind && d.doc.metadata.name === b.doc.roleRef.name);
    assert.ok(role, `${b.where}: binds ${b.doc.roleRef.kind} ${b.doc.roleRef.name}, which is not in the manifests`);
    rules.push(...role.doc.rules);
  }
  const names = [flagValue(args, '--prefill-deployment') || 'duet-prefill',
                 flagValue(args, '--decode-deployment') || 'duet-decode'];
  for (const name of names) {
    assert.ok(docs.some((d) => d.doc.kind === 'Deployment' && d.doc.metadata.name === name),
              `${at}: resizes Deployment ${name}, which is not in the manifests`);
    for (const verb of ['get', 'patch']) {
      assert.ok(rules.some((r) => (r.apiGroups || []).includes('apps') &&
                                  (r.resources || []).includes('deployments/scale') &&
                                  (r.verbs || []).includes(verb) &&
                                  (!r.resourceNames || r.resourceNames.includes(name))),
                `${at}: service account ${sa} may not ${verb} deployments/scale ${name}`);
    }
  }
}

function main() {
  const dir = process.argv[2];
  if (!dir) usage('usage: k8s_manifests_check.js DIR');
  const docs = [];
  for (const file of fs.readdirSync(dir).filter((f) => f.endsWith('.yaml')).sort()) {
    YAML.parseAllDocuments(fs.readFileSync(path.join(dir, file), 'utf8')).forEach((d, i) => {
      assert.equal(d.errors.length, 0, `${file}: ${d.errors.join('; ')}`);
      docs.push({ file, where: `${file} document ${i + 1}`, doc: d.toJS() });
    });
  }
  assert.ok(docs.length > 0, `no manifests in ${dir}`);
  for (const d of docs) validate(d.doc, d.where);

  // The schema check must be able to fail: a broken copy of the first
  // Deployment is refused.
  const first = docs.find((d) => d.doc.kind === 'Deployment');
  assert.ok(first, 'no Deployment');
  const broken = JSON.parse(JSON.stringify(first.doc));
  broken.spec.replicas = 'two';
  assert.throws(() => validate(broken, 'broken copy'), 'the schemas accepted replicas: "two"');

  const deployments = docs.filter((d) => d.doc.kind === 'Deployment');
  const services = docs.filter((d) => d.doc.kind === 'Service');
  const out = [];
  for (const { file, where, doc } of deployments) {
    const pod = doc.spec.template;
    assert.ok(subset(doc.spec.selector.matchLabels, pod.metadata.labels),
              `${where}: the selector does not match the pod labels`);
    const annotations = pod.metadata.annotations || {};
    for (const c of pod.spec.containers) {
      const at = `${where} container ${c.name}`;
      for (const probe of ['readinessProbe', 'livenessProbe']) {
        const p = c[probe];
        assert.ok(p, `${at}: no ${probe}`);
        portOf(c, (p.httpGet || p.tcpSocket).port, `${at} ${probe}`);
      }
      if (annotations['prometheus.io/scrape'] === 'true') {
        portOf(c, Number(annotations['prometheus.io/port']), `${at} prometheus.io/port`);
      }
      const args = (c.args || []).map((a) => a.replace(/\$\((\w+)\)/g, (m, v) => {
        const env = (c.env || []).find((e) => e.name === v);
        assert.ok(env && samples[v], `${at}: $(${v}) is not set from the downward API`);
        return samples[v];
      }));
      const router = flagValue(args, '--router');
      if (router) {
        // Workers: HOST:PORT of the control port; the planner: the API's URL.
        const [host, port] = router.replace(/^https?:\/\//, '').split(':');
        const svc = services.find((s) => s.doc.metadata.name === host);
        assert.ok(svc, `${at}: --router ${router} names no Service`);
        assert.ok(svc.doc.spec.ports.some((p) => p.port === Number(port)), `${at}: Service ${host} has no port ${port}`);
      }
      const drain = Number(flagValue(args, '--drain-timeout-s') || 0);
      assert.ok(drain < (pod.spec.terminationGracePeriodSeconds || 30),
                `${at}: the grace period does not outlast --drain-timeout-s ${drain}`);
      if (args[0] === 'planner') {
        checkPlannerRbac(docs, pod, args, at);
        // The check must be able to fail: without patch, the Role is refused.
        const stripped = docs.map((d) => (d.doc.kind !== 'Role' ? d : {
          ...d, doc: { ...d.doc, rules: d.doc.rules.map((r) => ({ ...r, verbs: r.verbs.filter((v) => v !== 'patch') })) },
        }));
        assert.throws(() => checkPlannerRbac(stripped, pod, args, at), /may not patch/,
                      'the RBAC check accepted a Role without patch');
      }
      out.push({ file, container: c.name, args });
    }
  }
  for (const { where, doc } of services) {
    const selected = deployments.filter((d) => subset(doc.spec.selector, d.doc.spec.template.metadata.labels));
    assert.equal(selected.length, 1, `${where}: selects ${selected.length} Deployments' pods, not 1`);
    const pod = selected[0].doc.spec.template.spec;
    for (const p of doc.spec.ports) {
      const target = p.targetPort === undefined ? p.port : p.targetPort;
      assert.ok(pod.containers.some((c) => (c.ports || []).some((cp) => cp.name === target || cp.containerPort === target)),
                `${where}: targetPort ${target} is no port of the pods it selects`);
    }
  }
  process.stdout.write(JSON.stringify({ containers: out }) + '\n');
}

main();
