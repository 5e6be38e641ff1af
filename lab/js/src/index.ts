// gpulab in JupyterLab: the slice in the status bar, a side panel with the user's
// jobs, endpoints, alerts and usage, and palette commands. Everything it shows
// comes through this server's gpulab routes (lab/handlers.py).
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget } from '@jupyterlab/apputils';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { addDashboard } from './dashboard';
import { GpuLabPanel, SECTIONS } from './panel';
import { SliceStatus } from './statusbar';

import gpuSvg from '../style/gpu.svg';

const gpuIcon = new LabIcon({ name: 'gpulab:gpu', svgstr: gpuSvg });

const CATEGORY = 'gpulab';
const OPEN_PANEL = 'gpulab:open-panel';
const OPEN_SECTION = 'gpulab:open-section';

const plugin: JupyterFrontEndPlugin<void> = {
  id: '@gpulab/lab:plugin',
  description: 'gpulab: the GPU slice in the status bar; jobs, endpoints, alerts and usage.',
  autoStart: true,
  optional: [IStatusBar, ICommandPalette, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ) => {
    const panel = new GpuLabPanel();
    panel.title.icon = gpuIcon;
    app.shell.add(panel, 'right', { rank: 900 });
    if (restorer) {
      restorer.add(panel, 'gpulab-panel');
    }

    app.commands.addCommand(OPEN_PANEL, {
      label: 'gpulab: Open panel',
      caption: 'Jobs, endpoints, alerts and GPU usage',
      execute: (args: any) => {
        if (args && args.section) {
          panel.select(String(args.section));
        }
        app.shell.activateById(panel.id);
      }
    });

    const names: { [key: string]: string } = {
      slice: 'Slice',
      jobs: 'Jobs',
      endpoints: 'Endpoints',
      alerts: 'Alerts',
      usage: 'Usage',
      pools: 'Pools'
    };
    app.commands.addCommand(OPEN_SECTION, {
      label: (args: any) => `gpulab: Open ${names[String(args.section)] || 'section'} in a tab`,
      caption: 'A gpulab section in the main area, where it can be docked beside notebooks',
      execute: (args: any) => {
        const key = String(args.section || 'jobs');
        const make = SECTIONS[key];
        if (!make) {
          return;
        }
        const content = make();
        const widget = new MainAreaWidget({ content });
        widget.id = `gpulab-main-${key}-${Date.now()}`;
        widget.title.label = `gpulab ${names[key]}`;
        widget.title.icon = gpuIcon;
        widget.title.closable = true;
        widget.addClass('gpulab-MainArea');
        app.shell.add(widget, 'main');
        app.shell.activateById(widget.id);
      }
    });

    if (palette) {
      palette.addItem({ command: OPEN_PANEL, category: CATEGORY });
      for (const key of Object.keys(SECTIONS)) {
        palette.addItem({ command: OPEN_SECTION, category: CATEGORY, args: { section: key } });
      }
    }

    addDashboard(app, palette, restorer, panel, gpuIcon);

    if (statusBar) {
      const alerts = panel.section('alerts');
      const item = new SliceStatus(
        gpuIcon,
        firing => void app.commands.execute(OPEN_PANEL, { section: firing ? 'alerts' : 'slice' }),
        firing => {
          if (alerts) {
            alerts.title.label = firing ? `Alerts (${firing})` : 'Alerts';
          }
        }
      );
      statusBar.registerStatusItem('@gpulab/lab:slice', {
        item,
        align: 'left',
        rank: 100
      });
    }
  }
};

export default plugin;
