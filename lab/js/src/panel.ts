// The gpulab side panel: this server's Slice (and what else holds GPU), Jobs,
// Endpoints, Alerts, Usage and Pools as tabs.
import { TabPanel } from '@lumino/widgets';

import { AlertsSection } from './alerts';
import { EndpointsSection } from './endpoints';
import { JobsSection } from './jobs';
import { PoolsSection } from './pools';
import { Section } from './section';
import { SliceSection } from './slice';
import { UsageSection } from './usage';

export const SECTIONS: { [key: string]: () => Section } = {
  slice: () => new SliceSection(),
  jobs: () => new JobsSection(),
  endpoints: () => new EndpointsSection(),
  alerts: () => new AlertsSection(),
  usage: () => new UsageSection(),
  pools: () => new PoolsSection()
};

export class GpuLabPanel extends TabPanel {
  constructor() {
    super({ tabPlacement: 'top', tabsMovable: false });
    this.id = 'gpulab-panel';
    this.addClass('gpulab-Panel');
    this.title.caption = 'gpulab: your slice, jobs, endpoints, alerts, usage, pools';
    for (const key of Object.keys(SECTIONS)) {
      this.addWidget(SECTIONS[key]());
    }
  }

  /** Show one section ("slice", "jobs", "endpoints", "alerts", "usage", "pools"). */
  select(key: string): void {
    const i = this.widgets.findIndex(w => (w as Section).key === key);
    if (i >= 0) {
      this.currentIndex = i;
    }
  }

  /** The section of ``key``, if the panel has it. */
  section(key: string): Section | undefined {
    return this.widgets.find(w => (w as Section).key === key) as Section | undefined;
  }
}
