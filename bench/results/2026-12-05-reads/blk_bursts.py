import sys, re, statistics as S
def ana(path, comm_filter):
    ev=[]
    for line in open(path):
        m=re.match(r'\s*(\S+)\s+(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)',line)
        if not m: continue
        comm,tid,t,e,rest=m.groups(); t=float(t)
        if e.startswith('block:'):
            f=rest.split()
            if f[0]!='254,0' or 'R' not in f[1]: continue
            ev.append((t,e[6:],f[3] if e.endswith('complete') else f[4]))
        elif comm_filter in comm:
            ev.append((t,e.split(':')[1],comm))
    ev.sort()
    # in-flight by sector matching (issue/complete), to ignore those in flight at start
    inflight=set(); tw=0; last=None; n=0; samples=[]
    t0=ev[0][0]; t1=ev[-1][0]
    issued_in=0; done=0
    bursts=[]; cur=[]
    lastc=None
    for t,e,x in ev:
        if e=='block_rq_issue':
            inflight.add(x); issued_in+=1
        elif e=='block_rq_complete':
            if last is not None: tw+=len(inflight)*(t-last)
            inflight.discard(x); done+=1
            if lastc is not None and t-lastc>30e-6:
                bursts.append(cur); cur=[]
            cur.append(t); lastc=t
        last=t if e in('block_rq_issue','block_rq_complete') else last
    print(path, 'completions/s %.0f'%(done/(t1-t0)), 'avg in flight %.1f'%(tw/(t1-t0)),
          'bursts %d, size median %d mean %.1f'%(len(bursts), S.median(len(b) for b in bursts), S.mean(len(b) for b in bursts)))
    # time from a completion to its slot's re-issue: for each completion, the next issue after it (FIFO matching)
    comp=[t for t,e,x in ev if e=='block_rq_complete']; iss=[t for t,e,x in ev if e=='block_rq_issue']
    # pair k-th completion with the (k+D)-th issue? approximate with queue: after a completion, the next unmatched issue
    import collections
    q=collections.deque(); lat=[]
    j=0
    for t,e,x in ev:
        if e=='block_rq_complete': q.append(t)
        elif e=='block_rq_issue' and q: lat.append(t-q.popleft())
    lat.sort()
    print('  completion -> re-issue (FIFO-matched) us: p10 %.0f p50 %.0f p90 %.0f mean %.0f'%(lat[len(lat)//10]*1e6, lat[len(lat)//2]*1e6, lat[9*len(lat)//10]*1e6, S.mean(lat)*1e6))
    # syscalls
    ent=[t for t,e,x in ev if e=='sys_enter_io_uring_enter']
    print('  io_uring_enter/s %.0f'%(len(ent)/(t1-t0)))
ana('ps_reader.txt','ab_plain')
ana('ps_fio.txt','fio')
