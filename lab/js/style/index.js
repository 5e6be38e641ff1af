import './base.css';
import './dashboard.css';
