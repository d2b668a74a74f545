#!/usr/bin/env python3
"""An interleaved A/B of two dipam builds on the warm pool, 8 ADDs at a time (root).

    ipam-burst-ab.py N ROUNDS OLD_DIR NEW_DIR

Each directory holds a build's dipam and dipamd. Per round, in a rotating order, a burst of N
pods is added 8 at a time (then deleted) on each of: ptp + host-local (the reference,
Debian's /usr/lib/cni), ptp + dipam and dipam main mode on OLD's dipamd, and the same two on
NEW's dipamd. Each dipamd runs `--warm-pool N` (a pool as large as the burst), and every burst
waits for its pool to be full. Rotating the order within one run spreads a shared machine's
load over both builds alike (docs/performance.md, run 27). Prints every configuration's ADD
p50/p90/p99 (spawn to reap) and its p50 against the reference.
"""
import subprocess,time,sys,statistics,os,json,glob,tempfile
from concurrent.futures import ThreadPoolExecutor
N=int(sys.argv[1]); R=int(sys.argv[2]); OLD,NEW=sys.argv[3],sys.argv[4]; T=8
W=tempfile.mkdtemp(prefix='ipam-burst-ab-'); os.makedirs(W,exist_ok=True)
def conf(name,ipam,binp): 
    c={"cniVersion":"1.0.0","name":name,"type":"ptp","ipMasq":False,"mtu":1500,"ipam":ipam}
    p=f'{W}/{name}.json'; json.dump(c,open(p,'w')); return p
def hl(name,sub): return {"type":"host-local","dataDir":f"{W}/hl-{name}","ranges":[[{"subnet":sub}]],"routes":[{"dst":"0.0.0.0/0"}]}
daemons={}
cfgs=[]
cfgs.append(('ref',conf('abref',hl('abref','10.240.0.0/20'),None),'/usr/lib/cni','abref','/usr/lib/cni/ptp'))
for i,(tag,bd) in enumerate([('old',OLD),('new',NEW)]):
    d=f'{W}/d-{tag}'; subprocess.run(['rm','-rf',d]); os.makedirs(d)
    bindir=f'{W}/bin-{tag}'; os.makedirs(bindir,exist_ok=True)
    for p,src in [('dipam',bd+'/dipam'),('host-local','/usr/lib/cni/host-local'),('ptp','/usr/lib/cni/ptp')]:
        if os.path.lexists(f'{bindir}/{p}'): os.remove(f'{bindir}/{p}')
        os.symlink(src,f'{bindir}/{p}')
    log=open(f'{d}/log','w')
    pr=subprocess.Popen([bd+'/dipamd','--socket',f'{d}/s.sock','--state-dir',f'{d}/state','--cni-path',bindir,'--log-level','debug','--log-format','json','--dead-after','0','--warm-pool',str(N),'--node-name','ab'+tag],stdout=log,stderr=log)
    daemons[tag]=pr
    name='ab'+tag
    cfgs.append((tag,conf(name,{"type":"dipam","socketPath":f'{d}/s.sock',"delegate":hl(name,f'10.24{1+i}.0.0/20')},bindir),bindir,name,'/usr/lib/cni/ptp'))
    mn='abm'+tag; mc={"cniVersion":"1.0.0","name":mn,"type":"dipam","socketPath":f'{d}/s.sock',"mtu":1500,"ipam":hl(mn,f'10.24{3+i}.0.0/20')}
    json.dump(mc,open(f'{W}/{mn}.json','w'))
    cfgs.append(('main-'+tag,f'{W}/{mn}.json',bindir,mn,bindir+'/dipam'))
time.sleep(2)
def run(cmd,cid,confp,cnipath,ns,exe):
    e=dict(os.environ,CNI_COMMAND=cmd,CNI_CONTAINERID=cid,CNI_NETNS='/var/run/netns/'+ns,CNI_IFNAME='eth0',CNI_PATH=cnipath)
    t=time.perf_counter(); p=subprocess.run([exe],stdin=open(confp),stdout=subprocess.DEVNULL,stderr=subprocess.PIPE,env=e)
    d=(time.perf_counter()-t)*1000
    if p.returncode: print('FAIL',cmd,cid,p.stderr[:300]); return None
    return d
def pool_ready(tag,name,n):
    if tag=='ref': return True
    if not os.path.isdir(f'{W}/hl-{name}/{name}'): return False
    return len(glob.glob(f'{W}/hl-{name}/{name}/1*'))>=n
res={c[0]:[] for c in cfgs}; loads=[]
# one untimed pod per network: a fresh dipamd's pool fills for the config it has seen
for tag,confp,cp,name,exe in cfgs:
    subprocess.run(['ip','netns','add','abw'+tag]); run('ADD','abw'+tag,confp,cp,'abw'+tag,exe); run('DEL','abw'+tag,confp,cp,'abw'+tag,exe); subprocess.run(['ip','netns','delete','abw'+tag])
for r in range(R):
    order=cfgs[r%len(cfgs):]+cfgs[:r%len(cfgs)]
    for tag,confp,cp,name,exe in order:
        t0=time.time()
        while not pool_ready(tag,name,N) and time.time()-t0<120: time.sleep(0.5)
        ids=[f'ab{tag}{r}x{k}' for k in range(N)]
        for i in ids: subprocess.run(['ip','netns','add',i])
        loads.append(open('/proc/loadavg').read().split()[0])
        with ThreadPoolExecutor(T) as ex: lat=list(ex.map(lambda i: run('ADD',i,confp,cp,i,exe),ids))
        res[tag]+= [x for x in lat if x is not None]
        with ThreadPoolExecutor(T) as ex: list(ex.map(lambda i: run('DEL',i,confp,cp,i,exe),ids))
        for i in ids: subprocess.run(['ip','netns','delete',i])
        print(f'round {r} {tag}: p50 {statistics.median([x for x in lat if x]):.1f} ms load {loads[-1]}',flush=True)
ref=statistics.median(res['ref'])
print('ADD latency ms, spawn to reap, every ADD of every round')
for k,v in res.items():
    v.sort(); print(f'{k:4s} n {len(v):4d} p50 {statistics.median(v):7.1f} p90 {v[int(.9*len(v))]:7.1f} p99 {v[int(.99*len(v))]:7.1f}  p50/ref {statistics.median(v)/ref:.2f}')
print('loads at burst starts',' '.join(loads))
for tag,pr in daemons.items(): pr.terminate(); pr.wait()
